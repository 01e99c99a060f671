"""Evaluates an ELMo model: probing tasks (wsd, pos, sentiment) and perplexity.

  elmo-jax evaluate --task=all --workdir=runs/small --probe_data_dir=DIR   # or: python evaluate.py ... in a clone
  elmo-jax evaluate --task=pos --options_file=O --weight_file=W --output_dir=OUT \
      --max_examples=500
  elmo-jax evaluate --task=wsd --model=original --output_dir=OUT           # or a folder, archive, URL, hf://
  elmo-jax evaluate --task=perplexity --workdir=runs/small --text_file=test.txt.gz
  elmo-jax evaluate --task=sentiment --workdir=runs/small --tfds_data_dir=~/tensorflow_datasets \
      --train_file=tfds:glue/sst2:train --test_file=tfds:glue/sst2:validation

Each task writes OUT/TASK.json and PNG plots and prints a short table; `all`
runs every task whose data is given (skipping the others with one line naming the
flag that supplies it), checks all inputs before any work, writes OUT/report.md
and exits 0 when at least one task ran. Bad input exits non-zero with one line on
stderr.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from typing import Callable, Sequence

from absl import flags, logging

from elmo_jax import cli
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.evaluation import features
from elmo_jax.evaluation import outputs
from elmo_jax.evaluation import readers
from elmo_jax.evaluation import tasks as tasks_lib
from elmo_jax.formats.options import OptionsError
from elmo_jax.formats.weights import WeightFileError
from elmo_jax.runtime import devices
from elmo_jax.runtime import files
from elmo_jax.runtime import progress
from elmo_jax.runtime import run_layout
from elmo_jax.runtime import storage
from elmo_jax.sources import resolve
from elmo_jax.sources.resolve import ResolvedModel

_TASK_NAMES = ["perplexity", "wsd", "pos", "sentiment", "all"]

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the command's flags; only when run as a command (`cli.run_main`), so importing it adds none."""
  flags.DEFINE_enum("task", None, _TASK_NAMES, "What to evaluate.")
  flags.DEFINE_string("workdir", None, "A training run (uses WORKDIR/export/).")
  flags.DEFINE_string("options_file", None, "ELMo options.json (with --weight_file).")
  flags.DEFINE_string("weight_file", None, "ELMo hdf5 weights (with --options_file).")
  flags.DEFINE_string("model", None, "A released ELMo (small, medium, original, original_5.5B; "
                      "downloaded once into $ELMO_JAX_CACHE), a folder (options.json + weights.hdf5, "
                      "elmo_jax's safetensors folder, a TF-Hub module, an ELMoForManyLangs folder), an "
                      "archive, a URL or hf://owner/name: every spec `elmo-jax embed --model` takes; "
                      "instead of --options_file/--weight_file. Perplexity needs a softmax: TF-Hub and "
                      "ELMoForManyLangs models carry none.")
  flags.DEFINE_string("output_dir", None, "Output directory; default WORKDIR/eval.")
  flags.DEFINE_string("train_file", None,
                      "Train file of the single task given (pos or sentiment); "
                      "sentiment also takes tfds:NAME:SPLIT, pos does not (TFDS has "
                      "no standard POS dataset).")
  flags.DEFINE_string("test_file", None,
                      "Test file of the single task given (pos or sentiment); "
                      "sentiment also takes tfds:NAME:SPLIT.")
  flags.DEFINE_string("probe_data_dir", None,
                      "Directory of the probe sets: wsd/wsd.tsv, pos/{train,test}.conll, "
                      "sentiment/{train,test}.tsv (none ship with the code); the per-file "
                      "flags override it.")
  flags.DEFINE_string("wsd_file", None,
                      "WSD TSV: lemma, pos, sense, token_index, sentence.")
  flags.DEFINE_string("wsd_train_file", None,
                      "Optional WSD TSV for the sense-centroid protocol.")
  flags.DEFINE_string("wsd_lemma", None, "Lemma of the WSD PCA plot.")
  flags.DEFINE_string("pos_train_file", None,
                     "CoNLL word<TAB>TAG (a file: TFDS has no standard POS dataset).")
  flags.DEFINE_string("pos_test_file", None,
                      "CoNLL word<TAB>TAG (a file: TFDS has no standard POS dataset).")
  flags.DEFINE_string("sentiment_train_file", None,
                      "TSV label<TAB>sentence, or tfds:NAME:SPLIT "
                      "(e.g. tfds:glue/sst2:train).")
  flags.DEFINE_string("sentiment_test_file", None,
                      "TSV label<TAB>sentence, or tfds:NAME:SPLIT "
                      "(e.g. tfds:glue/sst2:validation; sst2's test is unlabelled).")
  flags.DEFINE_string("tfds_data_dir", None,
                      "TFDS data_dir of tfds:NAME:SPLIT inputs and --tfds_name; "
                      "default TFDS's own. Datasets are never downloaded here.")
  flags.DEFINE_string("tfds_text_key", None,
                      "Text feature of tfds: sentiment data; default sentence, "
                      "else text.")
  flags.DEFINE_string("tfds_label_key", None,
                      "Integer label feature of tfds: sentiment data; default label.")
  flags.DEFINE_integer("max_examples", None,
                       "Use only the first N sentences/rows of each file (quick runs).")
  flags.DEFINE_integer("batch_size", 64, "Sentences per embedder call.")
  flags.DEFINE_integer("seed", 0, "Seed of the probes and of the untrained twin.")
  flags.DEFINE_bool("no_cache", False, "Do not read/write OUT/cache.")
  flags.DEFINE_integer("probe_max_epochs", 60, "Probe epoch limit.")
  flags.DEFINE_float("probe_learning_rate", 1e-2, "Probe Adam learning rate.")
  # Perplexity; None means "the workdir's training config, else the built-in default".
  flags.DEFINE_string("text_file", None,
                      "Perplexity text, one sentence per line (.gz ok; comma-separated "
                      "files) or a directory made by `elmo-jax prepare`; default: "
                      "the workdir config's data.eval_files.")
  flags.DEFINE_string("tfds_name", None, "Perplexity on a TFDS dataset (e.g. lm1b).")
  flags.DEFINE_string("tfds_split", "test", "Split of --tfds_name.")
  flags.DEFINE_string("vocab_file", None,
                      "Vocabulary of the softmax; default WORKDIR/vocab.txt or vocab.txt "
                      "next to --weight_file (vocab_counts.tsv beside it feeds unigram_ppl).")
  flags.DEFINE_integer("unroll_steps", None,
                       "Perplexity window length; default the run's, else 20.")
  flags.DEFINE_integer("max_batches", 0, "Perplexity batches to score; 0 = all.")
  flags.DEFINE_bool("progress", True, "Progress bars on stderr (--noprogress: none; off "
                     "anyway when stderr is not a terminal).")
  flags.DEFINE_bool("pretokenized", None,
                    "Perplexity text is whitespace-tokenized; default the run's, else Moses.")


def _check_tfds(field: str, path: str | None) -> None:
  """`tfds:NAME:SPLIT` is for sentiment data only (TFDS has no standard POS/WSD dataset)."""
  if not readers.is_tfds(path):
    return
  if not field.startswith("sentiment_"):
    raise readers.InputError(f"{path}: TFDS inputs are for sentiment only (TFDS has no "
                             "standard POS/WSD dataset); export it to TSV/CoNLL and pass the file")
  readers.parse_tfds(path)


def _resolved_model() -> ResolvedModel | None:
  """--model: what it names (`resolve.resolve_model`: every spec `elmo-jax embed --model` takes; fetched once),
  or None without it."""
  if not FLAGS.model:
    return None
  if FLAGS.workdir or FLAGS.options_file or FLAGS.weight_file:
    raise readers.InputError("give one of --model, --workdir or --options_file/--weight_file")
  return resolve.resolve_model(FLAGS.model)


def _check_numbers() -> None:
  """Counts and rates of the flags, before any work (a download, a model load, a probe trained for 0
  epochs): one line naming the flag."""
  cli.check_flag_numbers(readers.InputError,
                         at_least=[(FLAGS[name], low) for name, low in (
                             ("probe_max_epochs", 1), ("batch_size", 1), ("max_batches", 0), ("max_examples", 1),
                             ("unroll_steps", 1))],
                         within=[(FLAGS["probe_learning_rate"], "a number > 0", lambda x: x > 0)])


def config_from_flags() -> tuple[str, tasks_lib.EvalConfig]:
  """Validates flag combinations; returns (task, config)."""
  task = FLAGS.task
  _check_numbers()
  model = _resolved_model()
  if task is None:
    raise readers.InputError("--task is required: one of " + ", ".join(_TASK_NAMES))
  if bool(FLAGS.options_file) != bool(FLAGS.weight_file):
    raise readers.InputError("--options_file and --weight_file go together")
  if FLAGS.workdir and FLAGS.options_file:
    raise readers.InputError("give either --workdir or --options_file/--weight_file")
  for path in (FLAGS.options_file, FLAGS.weight_file):
    if path and not os.path.isfile(path):
      raise readers.InputError(f"{path}: file not found")
  output_dir = FLAGS.output_dir or (storage.join(FLAGS.workdir, run_layout.EVAL_DIR) if FLAGS.workdir
                                 else None)
  if not output_dir:
    raise readers.InputError("--output_dir is required without --workdir")
  probe = tasks_lib.probes.ProbeConfig(seed=FLAGS.seed, max_epochs=FLAGS.probe_max_epochs,
                                       learning_rate=FLAGS.probe_learning_rate)
  found = tasks_lib.probe_files(FLAGS.probe_data_dir)
  given = lambda flag, key: flag.value or found[key]  # noqa: E731
  cfg = tasks_lib.EvalConfig(
      output_dir=output_dir, workdir=_local_workdir(), wsd_file=given(FLAGS["wsd_file"], "wsd_file"),
      wsd_train_file=FLAGS.wsd_train_file, wsd_lemma=FLAGS.wsd_lemma,
      pos_train_file=given(FLAGS["pos_train_file"], "pos_train_file"),
      pos_test_file=given(FLAGS["pos_test_file"], "pos_test_file"),
      sentiment_train_file=given(FLAGS["sentiment_train_file"], "sentiment_train_file"),
      sentiment_test_file=given(FLAGS["sentiment_test_file"], "sentiment_test_file"),
      tfds_data_dir=FLAGS.tfds_data_dir, tfds_text_key=FLAGS.tfds_text_key,
      tfds_label_key=FLAGS.tfds_label_key, max_examples=FLAGS.max_examples, batch_size=FLAGS.batch_size,
      use_cache=not FLAGS.no_cache, probe=probe)
  cfg.perplexity = tasks_lib.perplexity.PerplexityConfig(
      text_file=FLAGS.text_file, tfds_name=FLAGS.tfds_name, tfds_split=FLAGS.tfds_split,
      tfds_data_dir=FLAGS.tfds_data_dir,
      options_file=FLAGS.options_file, weight_file=FLAGS.weight_file, model=model, vocab_file=FLAGS.vocab_file,
      # --batch_size defaults to 64 for the probes; perplexity matches the run's batch unless given.
      batch_size=FLAGS.batch_size if FLAGS["batch_size"].present else None, unroll_steps=FLAGS.unroll_steps,
      max_batches=FLAGS.max_batches, pretokenized=FLAGS.pretokenized)
  if FLAGS.vocab_file and not os.path.isfile(FLAGS.vocab_file):
    raise readers.InputError(f"{FLAGS.vocab_file}: file not found")
  if FLAGS.train_file or FLAGS.test_file:
    if task not in ("pos", "sentiment"):
      raise readers.InputError("--train_file/--test_file need --task=pos or --task=sentiment")
    if FLAGS.train_file:
      setattr(cfg, f"{task}_train_file", FLAGS.train_file)
    if FLAGS.test_file:
      setattr(cfg, f"{task}_test_file", FLAGS.test_file)
  for field in ("pos_train_file", "pos_test_file", "sentiment_train_file",
                "sentiment_test_file", "wsd_file", "wsd_train_file"):
    _check_tfds(field, getattr(cfg, field))
  return task, cfg


def _local_workdir() -> str | None:
  """--workdir, or for a bucket workdir a local copy of what evaluation reads (`run_layout.RUN_FILES`); a
  bucket run without an export yet is named as such (not by its local copy's missing file)."""
  if not FLAGS.workdir or not storage.is_remote(FLAGS.workdir):
    return FLAGS.workdir or None
  local = storage.local(FLAGS.workdir, names=run_layout.RUN_FILES)
  if not all(os.path.isfile(os.path.join(local, rel)) for rel in run_layout.export_files()):
    raise readers.InputError(f"--workdir={FLAGS.workdir} holds no {run_layout.EXPORT_DIR}/ yet: a run exports "
                             "its model at every checkpoint save; evaluate it after its first one")
  return local


def load_models_from_flags(model: ResolvedModel | None = None) -> tasks_lib.Models:
  """Builds the real Embedder and its untrained twin; `model`: what --model resolved to (resolved here if None)."""
  if FLAGS.workdir:
    workdir = _local_workdir()
    emb = Embedder.from_workdir(workdir, warm=False)  # a script: each shape compiles when first met
    key = features.model_key_from_workdir(workdir)
    description = {"workdir": FLAGS.workdir}
  elif FLAGS.model:
    model = model or _resolved_model()
    emb = Embedder.from_model(model, warm=False)
    key = features.model_key_from_paths(emb.input_files)
    description = {"model": FLAGS.model}
  elif FLAGS.options_file:
    emb = Embedder.from_files(FLAGS.options_file, FLAGS.weight_file, warm=False)
    key = features.model_key_from_files(FLAGS.options_file, FLAGS.weight_file)
    description = {"options_file": FLAGS.options_file, "weight_file": FLAGS.weight_file}
  else:
    raise readers.InputError("give --workdir, --model, or --options_file and --weight_file")
  twin = emb.untrained_twin(seed=FLAGS.seed)
  # The twin is a function of the config and the seed only.
  twin_key = hashlib.sha256((json.dumps(emb.options, sort_keys=True)
                             + f"|seed={FLAGS.seed}").encode()).hexdigest()[:16]
  description["n_layers"] = emb.n_layers
  return tasks_lib.Models(emb, twin, key, twin_key, description)


def main(argv: Sequence[str],
         load_models: Callable[[], tasks_lib.Models] | None = None) -> None:
  """Entry point; `load_models` lets tests inject a stand-in embedder."""
  if len(argv) > 1:
    sys.exit(f"evaluate.py: unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.progress:
    progress.set_enabled(False)
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # JAX's backend INFO lines would bury the one-line errors
  try:
    task, cfg = config_from_flags()
    # A bucket --output_dir: written locally, each file uploaded whole once every task finished.
    with storage.staged_output(cfg.output_dir, "--output_dir", directory=True,
                               inputs=outputs.input_files(cfg)) as cfg.output_dir:
      tasks_lib.run(task, cfg, load_models or functools.partial(load_models_from_flags, cfg.perplexity.model),
                    on_start=devices.announce)
  except (readers.InputError, files.UnsafeOutputError, tasks_lib.TaskUnavailable, OptionsError, WeightFileError,
          OSError) as e:
    sys.exit(f"evaluate.py: error: {e}")


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
