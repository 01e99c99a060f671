"""The base training config; `configs/*.py` start from it and change what differs."""
from __future__ import annotations

import ml_collections

from elmo_jax import options as options_lib


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # --- keys scripts rely on -------------------------------------------------------------------------
  c.seed = 0
  c.batch_size = 128  # global, in sequences (batch rows), split over all devices of all processes
  c.unroll_steps = 20  # truncated-BPTT window in tokens
  c.num_train_steps = 1000
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.log_every_steps = 50
  # --- model: the options.json of the biLM ---------------------------------------------------------
  c.options = ml_collections.ConfigDict(options_lib.preset("small"))
  c.dtype = "float32"  # compute dtype of the matmuls; params and optimizer state stay float32
  c.scan_unroll = 1
  c.dropout = 0.1
  # --- softmax ----------------------------------------------------------------------------------------
  c.n_negative_samples = 8192  # sampled softmax (bilm-tf); 0 = full softmax. Full when vocab is smaller.
  # --- optimizer (bilm-tf: Adagrad 0.2, initial accumulator 1.0, global-norm clip 10) -------------------
  c.optimizer = "adagrad"  # adagrad | adam | adamw
  c.learning_rate = 0.2
  c.adagrad_initial_accumulator = 1.0
  c.grad_clip = 10.0
  c.weight_decay = 0.0
  c.warmup_steps = 0
  # --- data ---------------------------------------------------------------------------------------------
  c.data = ml_collections.ConfigDict()
  c.data.train_files = "data/pd-small/train.txt.gz"  # comma-separated files or globs
  c.data.eval_files = "data/pd-small/valid.txt.gz"
  c.data.tfds_name = ""  # e.g. "lm1b": read TFDS (ArrayRecord) instead of text files
  c.data.tfds_data_dir = ""
  c.data.tfds_train_split = "train"
  c.data.tfds_eval_split = "test"
  c.data.tfds_text_key = "text"
  c.data.tfds_download = False
  c.data.pretokenized = False  # True: whitespace-split lines; False: Moses tokenizer
  c.data.vocab_file = ""  # an existing vocab (bilm-tf format); empty = build from the training split
  c.data.vocab_max_size = 100_000  # including <S>, </S>, <UNK>
  c.data.vocab_min_count = 1
  c.data.max_token_chars = 50
  c.eval_max_batches = 0  # 0 = the whole eval split
  # --- checkpoints ------------------------------------------------------------------------------------
  c.keep_checkpoints = 3
  c.init_from = ""  # another run's workdir/checkpoint, or an original ELMo options.json (weights beside)
  return c
