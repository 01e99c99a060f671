"""Training the biLM: losses, train state and sharded step, checkpoints, export, the train loop."""
