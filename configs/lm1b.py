"""The original ELMo recipe on the 1B Word Benchmark from TFDS (`lm1b`, ArrayRecord, no TensorFlow).

bilm-tf trained 10 epochs of ~800M tokens with batch 128 per GPU on 3 GPUs (global 384), unroll 20,
vocabulary of 793,471 words, 8192 sampled negatives. The batch here is bilm-tf's 128 rows per device, so the
same config runs on 4 or 256 TPU chips or 8 H200s; num_train_steps counts 10 epochs at bilm-tf's global 384,
so on N devices 10 epochs are --config.num_train_steps=$((10 * 800000000 / (128 * N * 20))).
Prepare the data once with network access:
  python -c "import tensorflow_datasets as tfds; tfds.data_source('lm1b', download=True)"
(or `tfds build lm1b --file_format=array_record`), then train with --config.data.tfds_data_dir if not default.
"""
from elmo_jax.training.config import released_config


def get_config():
  c = released_config("original")
  c.batch_size = 0  # global batch: per_device_batch_size x the devices
  c.per_device_batch_size = 128
  c.unroll_steps = 20
  # 10 epochs of ~800M tokens at bilm-tf's 3 x 128 x 20 tokens per step.
  c.num_train_steps = 10 * 800_000_000 // (384 * 20)
  c.eval_every_steps = 10_000
  c.checkpoint_every_steps = 5_000
  c.log_every_steps = 100
  c.eval_max_batches = 200
  c.data.tfds_name = "lm1b"
  c.data.tfds_train_split = "train"
  c.data.tfds_eval_split = "test"
  c.data.tfds_text_key = "text"
  c.data.pretokenized = True  # lm1b is already tokenized
  c.data.vocab_max_size = 793_471
  c.data.vocab_min_count = 3
  c.dtype = "bfloat16"
  c.shard_softmax = True  # 406M softmax params: never all-reduce them densely (see config.shard_softmax)
  return c
