"""The one place that knows a training run's folder (its workdir, local or `gs://`), as train.py writes it:

  <workdir>/
    config.json          the training config (config.to_dict())
    vocab.txt            the softmax vocabulary
    vocab_counts.tsv     its training counts (the unigram baseline of train.py and evaluate.py)
    metrics.jsonl        one JSON record per log / eval step
    tensorboard/         the same metrics for TensorBoard
    checkpoints/<step>/  Orbax checkpoints (train state, data position, log window)
    export/              options.json + weights.hdf5 (+ vocab.txt): the original ELMo format, at every save
    prepared/<key>/      the auto-prepared corpus (ids), `training/input.py`
    lexicon/             an ELMoForManyLangs-style run's char.dic and word.dic (`training/variant.py`)
    eval/                `evaluate.py --workdir`'s default output folder
    profile/             jax.profiler traces (`config.profile_steps`; `training/profile.py`)
    train.lock           the workdir lock (`training/lock.py`)

Names only: no I/O here, so every room (storage, files, training, embedding, evaluation) can ask.
"""
from __future__ import annotations

CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"
VOCAB_COUNTS_FILE = "vocab_counts.tsv"  # beside any vocab.txt (`data/vocab.py`)
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS = "checkpoints"
EXPORT_DIR = "export"
PREPARED_DIR = "prepared"
LEXICON_DIR = "lexicon"
EVAL_DIR = "eval"
PROFILE_DIR = "profile"
LOCK_FILE = "train.lock"
OPTIONS_FILE = "options.json"  # inside export/
WEIGHTS_FILE = "weights.hdf5"  # inside export/

# Every name a run writes at the top of its workdir, by kind (a new name goes in one of them:
# tests/training/test_bad_inputs_run_folder.py reads this module): preflight refuses an entry of the other kind (a
# folder named metrics.jsonl, a file named checkpoints) before anything is written.
TOP_FILES = (CONFIG_FILE, VOCAB_FILE, VOCAB_COUNTS_FILE, METRICS_FILE, LOCK_FILE)
TOP_FOLDERS = (TENSORBOARD_DIR, CHECKPOINTS, EXPORT_DIR, PREPARED_DIR, EVAL_DIR, PROFILE_DIR, LEXICON_DIR)
# What a run's start writes before its first step, and a rerun or a reader on a fresh machine reads back:
# a bucket workdir uploads exactly these before the first step (`training/loop.open_run`).
START_FILES = (CONFIG_FILE, VOCAB_FILE, VOCAB_COUNTS_FILE)
# What a reader of a finished run needs (embedding, evaluation): a bucket run copies just these.
RUN_FILES = (EXPORT_DIR, *START_FILES)
# In a bucket workdir these live in the bucket only (Orbax writes checkpoints there, the lock is an object
# there); everything else of the run is written to the local copy and uploaded.
BUCKET_ONLY = (CHECKPOINTS, LOCK_FILE)
# Folders a trained run owns: nothing else may be written into them.
RUN_FOLDERS = (CHECKPOINTS, EXPORT_DIR)


def export_files() -> tuple[str, str]:
  """(options, weights) paths relative to the workdir."""
  return f"{EXPORT_DIR}/{OPTIONS_FILE}", f"{EXPORT_DIR}/{WEIGHTS_FILE}"
