"""Embedding: the `Embedder` (sentences in, ELMo layers out), its compiled steps, the on-device token
table and token embedding files, and the HDF5 writer of the embedding command (`writer.embed_file`)."""
