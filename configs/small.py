"""The released 'small' ELMo size with bilm-tf's recipe (Adagrad 0.2, 8192 sampled negatives, dropout 0.1)."""
from elmo_jax.training.config import released_config


def get_config():
  return released_config("small")
