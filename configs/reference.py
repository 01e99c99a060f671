"""The reference run: the largest biLM that trains in about one hour on a 2-core CPU, on data/pd-mix.

pd-mix is 3.46M training words of public-domain English (shipped in data/pd-mix with its provenance README).
The model is the default config's shape scaled up where it pays on a CPU: LSTM 512 -> 128 instead of
256 -> 64, a wider char CNN with two highway layers, and a sampled softmax over the larger vocabulary.
Adam as in configs/default.py (Adagrad's slow start wastes a one-hour budget; see that file's docstring).
10,000 steps of 64 x 20 tokens (12.8M tokens, 3.2 epochs): 43 min on an unloaded 2-core AMD EPYC. The first
reference run stopped at 5,000 steps; doubling them is what turned frozen ELMo's sentiment margin positive
(results/reference/steps_5000/). Results of this run are in results/reference/ and the README's reference table.
"""
from elmo_jax.training.config import base_config


def get_config():
  c = base_config()
  c.options.char_cnn.embedding.dim = 16
  c.optimizer = "adam"
  c.dropout = 0.1
  c.data.train_files = "data/pd-mix/train.txt.gz"
  c.data.eval_files = "data/pd-mix/valid.txt.gz"
  c.batch_size = 64
  c.unroll_steps = 20
  c.num_train_steps = 10_000
  c.eval_every_steps = 2500
  c.checkpoint_every_steps = 500
  c.log_every_steps = 50
  c.eval_max_batches = 200
  c.options.char_cnn.filters = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256]]
  c.options.char_cnn.n_highway = 2
  c.options.lstm.dim = 512
  c.options.lstm.projection_dim = 128
  c.learning_rate = 2e-3
  c.warmup_steps = 200
  c.data.vocab_max_size = 40_000
  c.data.vocab_min_count = 3
  c.n_negative_samples = 4096
  return c
