"""CPU-sized biLM on the embedded public-domain corpus (data/pd-small): learns visibly in ~5 minutes."""
from elmo_jax.training.config import base_config


def get_config():
  c = base_config()
  c.batch_size = 32
  c.unroll_steps = 20
  c.num_train_steps = 1500
  c.eval_every_steps = 250
  c.checkpoint_every_steps = 500
  c.log_every_steps = 25
  c.options.char_cnn.embedding.dim = 16
  c.options.char_cnn.filters = [[1, 32], [2, 32], [3, 64], [4, 64], [5, 64]]
  c.options.char_cnn.n_highway = 1
  c.options.lstm.dim = 512
  c.options.lstm.projection_dim = 128
  c.data.vocab_max_size = 20_000
  c.data.vocab_min_count = 2
  c.n_negative_samples = 0  # a 20k vocabulary is cheap enough for the full softmax
  c.eval_max_batches = 0
  return c
