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
from elmo_jax.downstream import plots
from elmo_jax.downstream import train
from elmo_jax.downstream.train import DownstreamConfig
from elmo_jax.evaluation import plots as evaluation_plots
from elmo_jax.evaluation import readers
from elmo_jax.formats.options import OptionsError
from elmo_jax.formats.weights import WeightFileError
from elmo_jax.runtime import files
from elmo_jax.runtime import progress

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the command's flags; only when run as a command (`cli.run_main`), so importing it adds none."""
  flags.DEFINE_enum("task", None, list(data_lib.TASKS), "pos (token tagging) or sentiment (sentences).")
  flags.DEFINE_enum("elmo", "none", ["none", "frozen", "finetune"],
                    "none: baseline (word embeddings + char CNN learned from scratch); frozen: + a "
                    "learned scalar mix of the frozen biLM's layers; finetune: the biLM trains too.")
  flags.DEFINE_string("workdir", None, "Output directory (results.json, dev_curve.png).")
  flags.DEFINE_string("bilm", None, "The biLM: a training run's workdir, a folder with options.json + "
                      "weights.hdf5, a released name (small, medium, original) or a URL.")
  flags.DEFINE_enum("bilm_init", "trained", ["trained", "random"],
                    "random: the untrained twin of --bilm (same shape, random init; a control).")
  flags.DEFINE_string("data_dir", None, "Directory with pos/{train,dev,test}.conll and/or "
                      "sentiment/{train,dev,test}.tsv (none ship with the code).")
  flags.DEFINE_string("train", None, "Train split: CoNLL (pos), TSV label<TAB>sentence or "
                      "tfds:NAME:SPLIT (sentiment).")
  flags.DEFINE_string("dev", None, "Dev split (early stopping); default --data_dir's, else "
                      "--dev_fraction of train.")
  flags.DEFINE_string("test", None, "Test split.")
  flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir of tfds: inputs (never downloaded).")
  flags.DEFINE_integer("seed", 0, "Seed of init, dropout, batch order and --max_train_sentences.")
  flags.DEFINE_integer("num_epochs", 10, "Epoch limit.")
  flags.DEFINE_integer("patience", 3, "Stop after this many epochs without a better dev accuracy.")
  flags.DEFINE_integer("batch_size", 32, "Sentences per step.")
  flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate of the task model and the mixes.")
  flags.DEFINE_float("bilm_learning_rate", 1e-4, "Adam learning rate of the biLM (--elmo=finetune).")
  flags.DEFINE_float("mix_l2", 0.001, "lambda of lambda * ||w||^2 on the scalar-mix logits (paper).")
  flags.DEFINE_float("elmo_dropout", 0.5, "Dropout on the ELMo vectors (paper: 0.5).")
  flags.DEFINE_float("dropout", 0.5, "Dropout in the task model.")
  flags.DEFINE_bool("elmo_at_output", False, "Also concatenate a second mix to the BiLSTM output.")
  flags.DEFINE_bool("do_layer_norm", False, "Layer-normalise the biLM layers inside the mixes.")
  flags.DEFINE_integer("hidden", 128, "Task BiLSTM units per direction.")
  flags.DEFINE_integer("word_dim", 100, "Baseline word-embedding size.")
  flags.DEFINE_enum("pooling", "max", ["max", "attention"], "Sentence pooling (sentiment).")
  flags.DEFINE_integer("min_count", 2, "Training words seen fewer times are <unk>.")
  flags.DEFINE_integer("max_train_sentences", None, "Train on a seeded random subset.")
  flags.DEFINE_float("dev_fraction", 0.1, "Share of train held out when no dev split is given.")
  flags.DEFINE_enum("cache_dtype", "float16", ["float16", "float32"],
                    "Storage of the frozen biLM layers (computed once per sentence).")
  flags.DEFINE_string("layer_cache_dir", None,
                      "--elmo=frozen: also keep the biLM layers of each split here (npz, float16 by "
                      "default; keyed by the weights' hash and the sentences), so runs with other "
                      "seeds skip the biLM. Not cleaned up: delete it when done.")
  flags.DEFINE_bool("progress", True, "Progress bars on stderr.")


def check_numbers() -> None:
  """Counts and rates of the flags, before any work (reading data, loading the biLM): one line naming the
  flag (not a ValueError traceback at the first batch, or a TypeError after training 0 epochs)."""
  cli.check_flag_numbers(
      readers.InputError,
      at_least=[(FLAGS[name], low) for name, low in (
          ("num_epochs", 1), ("batch_size", 1), ("patience", 0), ("hidden", 1), ("word_dim", 1), ("min_count", 0),
          ("max_train_sentences", 1))],
      within=[(FLAGS["dev_fraction"], "between 0 and 1 (exclusive)", lambda x: 0 < x < 1),
              (FLAGS["learning_rate"], "> 0", lambda x: x > 0),
              (FLAGS["bilm_learning_rate"], "> 0", lambda x: x > 0),
              (FLAGS["mix_l2"], ">= 0", lambda x: x >= 0),
              (FLAGS["dropout"], "in [0, 1)", lambda x: 0 <= x < 1),
              (FLAGS["elmo_dropout"], "in [0, 1)", lambda x: 0 <= x < 1)])


def config_from_flags():
  check_numbers()
  if FLAGS.task is None:
    raise readers.InputError(f"--task is required: one of {', '.join(data_lib.TASKS)}")
  if not FLAGS.workdir:
    raise readers.InputError("--workdir is required (where results.json goes)")
  if FLAGS.elmo != "none" and not FLAGS.bilm:
    raise readers.InputError(f"--elmo={FLAGS.elmo} needs --bilm=RUN_DIR|FOLDER|NAME (e.g. a train.py "
                             "workdir, or `small` for the released small ELMo)")
  model = {"dropout": FLAGS.dropout, "elmo_dropout": FLAGS.elmo_dropout, "mix_l2": FLAGS.mix_l2,
           "elmo_at_output": FLAGS.elmo_at_output, "do_layer_norm": FLAGS.do_layer_norm, "hidden": FLAGS.hidden,
           "word_dim": FLAGS.word_dim, "pooling": FLAGS.pooling}
  return DownstreamConfig(
      task=FLAGS.task, elmo=FLAGS.elmo, workdir=FLAGS.workdir, bilm=FLAGS.bilm, bilm_init=FLAGS.bilm_init,
      seed=FLAGS.seed, num_epochs=FLAGS.num_epochs, patience=FLAGS.patience, batch_size=FLAGS.batch_size,
      learning_rate=FLAGS.learning_rate, bilm_learning_rate=FLAGS.bilm_learning_rate, min_count=FLAGS.min_count,
      dev_fraction=FLAGS.dev_fraction, max_train_sentences=FLAGS.max_train_sentences, cache_dtype=FLAGS.cache_dtype,
      layer_cache_dir=FLAGS.layer_cache_dir,
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
  if not FLAGS.progress:
    progress.set_enabled(False)
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    cfg = config_from_flags()
    paths = data_lib.resolve_paths(cfg.task, FLAGS.data_dir, {"train": FLAGS.train, "dev": FLAGS.dev,
                                                                "test": FLAGS.test})
    data_lib.check_outputs(cfg.workdir, paths, cfg.bilm, cfg.layer_cache_dir)
    splits = read_splits(cfg.task, FLAGS.data_dir, None, FLAGS.tfds_data_dir, cfg.dev_fraction, paths)
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
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
