"""Training the biLM: the input from a config (`input`), host -> device feeding (`feed`), the train state and
sharded steps (`step`), the optimizer, losses, checkpoints, resume, export and the train loop (`loop`)."""
