"""The released 'original' ELMo size with bilm-tf's recipe (Adagrad 0.2, 8192 sampled negatives, dropout 0.1)."""
import ml_collections

from elmo_jax import options as options_lib
from elmo_jax.training.config import base_config


def get_config():
  c = base_config()
  c.options = ml_collections.ConfigDict(options_lib.preset("original"))
  c.batch_size = 128
  c.num_train_steps = 100_000
  c.eval_every_steps = 5_000
  c.checkpoint_every_steps = 5_000
  c.log_every_steps = 100
  return c
