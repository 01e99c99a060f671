"""Model file formats, one module each: its reader, its writer, its checks. options.json (options), the hdf5
weights of bilm-tf / AllenNLP (weights, exact both ways), ELMoForManyLangs folders (efml, efml_export) and their
torch.save files read and written without torch (torch_pickle, torch_save), TensorFlow checkpoint bundles
(tf_bundle) and TF-Hub elmo/3 modules (tfhub), what a cached file must be (checks)."""
