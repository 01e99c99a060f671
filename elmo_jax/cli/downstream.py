"""Task models with ELMo: train and evaluate a POS tagger or a sentiment classifier.

  elmo-jax downstream --task=pos --elmo=none --data_dir=/path/to/probes --workdir=runs/pos-none
  elmo-jax downstream --task=pos --elmo=frozen --bilm=runs/ref --data_dir=/path/to/probes \
      --workdir=runs/pos-frozen-s0 --seed=0
  elmo-jax downstream --task=sentiment --elmo=finetune --bilm=small \
      --train=tfds:glue/sst2:train --test=tfds:glue/sst2:validation --workdir=runs/sst2-ft
  elmo-jax downstream table runs/*/ --output=runs/summary   # the side-by-side table

Writes WORKDIR/results.json (test accuracy of the best-dev epoch, dev curve, settings, hashes) and
WORKDIR/dev_curve.png. Bad input exits non-zero with one line on stderr.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from absl import flags, logging

from elmo_jax import cli
from elmo_jax.downstream import data as data_lib
from elmo_jax.evaluation import readers
from elmo_jax.formats.options import OptionsError
from elmo_jax.formats.weights import WeightFileError
from elmo_jax.runtime import files
from elmo_jax.runtime import progress
from elmo_jax.downstream import plots
from elmo_jax.downstream import train
from elmo_jax.downstream.train import DownstreamConfig
from elmo_jax.evaluation import plots as evaluation_plots

_TASK = flags.DEFINE_enum("task", None, list(data_lib.TASKS), "pos (token tagging) or sentiment (sentences).")
_ELMO = flags.DEFINE_enum("elmo", "none", ["none", "frozen", "finetune"],
                          "none: baseline (word embeddings + char CNN learned from scratch); frozen: + a "
                          "learned scalar mix of the frozen biLM's layers; finetune: the biLM trains too.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (results.json, dev_curve.png).")
_BILM = flags.DEFINE_string("bilm", None, "The biLM: a training run's workdir, a folder with options.json + "
                            "weights.hdf5, a released name (small, medium, original) or a URL.")
_BILM_INIT = flags.DEFINE_enum("bilm_init", "trained", ["trained", "random"],
                               "random: the untrained twin of --bilm (same shape, random init; a control).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Directory with pos/{train,dev,test}.conll and/or "
                                "sentiment/{train,dev,test}.tsv (none ship with the code).")
_TRAIN = flags.DEFINE_string("train", None, "Train split: CoNLL (pos), TSV label<TAB>sentence or "
                             "tfds:NAME:SPLIT (sentiment).")
_DEV = flags.DEFINE_string("dev", None, "Dev split (early stopping); default --data_dir's, else "
                           "--dev_fraction of train.")
_TEST = flags.DEFINE_string("test", None, "Test split.")
_TFDS_DIR = flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir of tfds: inputs (never downloaded).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of init, dropout, batch order and --max_train_sentences.")
_EPOCHS = flags.DEFINE_integer("num_epochs", 10, "Epoch limit.")
_PATIENCE = flags.DEFINE_integer("patience", 3, "Stop after this many epochs without a better dev accuracy.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sentences per step.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate of the task model and the mixes.")
_BILM_LR = flags.DEFINE_float("bilm_learning_rate", 1e-4, "Adam learning rate of the biLM (--elmo=finetune).")
_MIX_L2 = flags.DEFINE_float("mix_l2", 0.001, "lambda of lambda * ||w||^2 on the scalar-mix logits (paper).")
_ELMO_DROPOUT = flags.DEFINE_float("elmo_dropout", 0.5, "Dropout on the ELMo vectors (paper: 0.5).")
_DROPOUT = flags.DEFINE_float("dropout", 0.5, "Dropout in the task model.")
_AT_OUTPUT = flags.DEFINE_bool("elmo_at_output", False, "Also concatenate a second mix to the BiLSTM output.")
_LAYER_NORM = flags.DEFINE_bool("do_layer_norm", False, "Layer-normalise the biLM layers inside the mixes.")
_HIDDEN = flags.DEFINE_integer("hidden", 128, "Task BiLSTM units per direction.")
_WORD_DIM = flags.DEFINE_integer("word_dim", 100, "Baseline word-embedding size.")
_POOLING = flags.DEFINE_enum("pooling", "max", ["max", "attention"], "Sentence pooling (sentiment).")
_MIN_COUNT = flags.DEFINE_integer("min_count", 2, "Training words seen fewer times are <unk>.")
_MAX_TRAIN = flags.DEFINE_integer("max_train_sentences", None, "Train on a seeded random subset.")
_DEV_FRACTION = flags.DEFINE_float("dev_fraction", 0.1, "Share of train held out when no dev split is given.")
_CACHE_DTYPE = flags.DEFINE_enum("cache_dtype", "float16", ["float16", "float32"],
                                 "Storage of the frozen biLM layers (computed once per sentence).")
_LAYER_CACHE = flags.DEFINE_string("layer_cache_dir", None,
                                   "--elmo=frozen: also keep the biLM layers of each split here (npz, float16 by "
                                   "default; keyed by the weights' hash and the sentences), so runs with other "
                                   "seeds skip the biLM. Not cleaned up: delete it when done.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Progress bars on stderr.")


def check_numbers() -> None:
  """Counts and rates of the flags, before any work (reading data, loading the biLM): one line naming the
  flag (not a ValueError traceback at the first batch, or a TypeError after training 0 epochs)."""
  cli.check_flag_numbers(
      readers.InputError,
      at_least=[(_EPOCHS, 1), (_BATCH, 1), (_PATIENCE, 0), (_HIDDEN, 1), (_WORD_DIM, 1), (_MIN_COUNT, 0),
                (_MAX_TRAIN, 1)],
      within=[(_DEV_FRACTION, "between 0 and 1 (exclusive)", lambda x: 0 < x < 1),
              (_LR, "> 0", lambda x: x > 0), (_BILM_LR, "> 0", lambda x: x > 0),
              (_MIX_L2, ">= 0", lambda x: x >= 0),
              (_DROPOUT, "in [0, 1)", lambda x: 0 <= x < 1), (_ELMO_DROPOUT, "in [0, 1)", lambda x: 0 <= x < 1)])


def config_from_flags():
  check_numbers()
  if _TASK.value is None:
    raise readers.InputError(f"--task is required: one of {', '.join(data_lib.TASKS)}")
  if not _WORKDIR.value:
    raise readers.InputError("--workdir is required (where results.json goes)")
  if _ELMO.value != "none" and not _BILM.value:
    raise readers.InputError(f"--elmo={_ELMO.value} needs --bilm=RUN_DIR|FOLDER|NAME (e.g. a train.py "
                             "workdir, or `small` for the released small ELMo)")
  model = {"dropout": _DROPOUT.value, "elmo_dropout": _ELMO_DROPOUT.value, "mix_l2": _MIX_L2.value,
           "elmo_at_output": _AT_OUTPUT.value, "do_layer_norm": _LAYER_NORM.value, "hidden": _HIDDEN.value,
           "word_dim": _WORD_DIM.value, "pooling": _POOLING.value}
  return DownstreamConfig(
      task=_TASK.value, elmo=_ELMO.value, workdir=_WORKDIR.value, bilm=_BILM.value, bilm_init=_BILM_INIT.value,
      seed=_SEED.value, num_epochs=_EPOCHS.value, patience=_PATIENCE.value, batch_size=_BATCH.value,
      learning_rate=_LR.value, bilm_learning_rate=_BILM_LR.value, min_count=_MIN_COUNT.value,
      dev_fraction=_DEV_FRACTION.value, max_train_sentences=_MAX_TRAIN.value, cache_dtype=_CACHE_DTYPE.value,
      layer_cache_dir=_LAYER_CACHE.value,
      model=model)


def read_splits(task: str, data_dir, given, tfds_data_dir, dev_fraction: float,
                paths: dict[str, str] | None = None) -> dict[str, data_lib.Split]:
  """The splits (dev held out of train when none is given), their labels checked before any model loads."""
  paths = paths or data_lib.resolve_paths(task, data_dir, given)
  splits = {name: data_lib.read_split(task, name, path, tfds_data_dir)
            for name, path in paths.items() if path}
  if "dev" not in splits:
    splits["train"], splits["dev"] = data_lib.hold_out(splits["train"], dev_fraction)
  data_lib.label_ids(task, splits["train"])  # e.g. a hold-out that left one label: say so now, not later
  return splits


def write_outputs(workdir: str, results: dict) -> None:
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(6.0, 3.6), layout="constrained")
  ax = fig.add_subplot()
  plots.dev_curve(ax, [results])
  results["plots"] = [evaluation_plots.save(fig, os.path.join(workdir, "dev_curve.png"))]
  files.write_json(os.path.join(workdir, "results.json"), results)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    sys.exit(f"{cli.command_name()}: unexpected arguments: {' '.join(argv[1:])}")
  if not _PROGRESS.value:
    progress.set_enabled(False)
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    cfg = config_from_flags()
    paths = data_lib.resolve_paths(cfg.task, _DATA_DIR.value, {"train": _TRAIN.value, "dev": _DEV.value,
                                                                "test": _TEST.value})
    data_lib.check_outputs(cfg.workdir, paths, cfg.bilm, cfg.layer_cache_dir)
    splits = read_splits(cfg.task, _DATA_DIR.value, None, _TFDS_DIR.value, cfg.dev_fraction, paths)
    bilm = train.load_bilm(cfg.bilm, cfg.bilm_init, cfg.seed) if cfg.elmo != "none" else None
    sizes = {name: f"{len(s.tokens)} sentences" for name, s in splits.items()}
    kept = data_lib.subsample_size(len(splits["train"].tokens), cfg.max_train_sentences)
    if kept < len(splits["train"].tokens):
      sizes["train"] = f"{kept} of {sizes['train']} (--max_train_sentences)"
    print(f"{cfg.task} elmo={cfg.elmo} seed={cfg.seed}: " + ", ".join(
        f"{name} {size}" for name, size in sizes.items()), file=sys.stderr)
    results = train.run(cfg, splits, bilm, on_epoch=lambda row: print(
        f"epoch {row['epoch']}: train loss {row['train_loss']:.4f}, dev accuracy {row['dev_accuracy']:.4f} "
        f"({row['seconds']:.0f} s)", file=sys.stderr))
  except (readers.InputError, files.UnsafeOutputError, OptionsError, WeightFileError, OSError) as e:
    sys.exit(f"{cli.command_name()}: error: {e}")
  results.pop("_params")
  write_outputs(cfg.workdir, results)
  print(json.dumps({k: results[k] for k in ("task", "elmo", "seed", "best_epoch", "dev_accuracy",
                                            "test_accuracy")}))


def run() -> None:
  cli.run_main(main)


if __name__ == "__main__":
  run()
