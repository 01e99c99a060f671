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

_TASK = flags.DEFINE_enum("task", None, _TASK_NAMES, "What to evaluate.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A training run (uses WORKDIR/export/).")
_OPTIONS = flags.DEFINE_string("options_file", None, "ELMo options.json (with --weight_file).")
_WEIGHTS = flags.DEFINE_string("weight_file", None, "ELMo hdf5 weights (with --options_file).")
_MODEL = flags.DEFINE_string("model", None, "A released ELMo (small, medium, original, original_5.5B; "
                             "downloaded once into $ELMO_JAX_CACHE), a folder (options.json + weights.hdf5, "
                             "elmo_jax's safetensors folder, a TF-Hub module, an ELMoForManyLangs folder), an "
                             "archive, a URL or hf://owner/name: every spec `elmo-jax embed --model` takes; "
                             "instead of --options_file/--weight_file. Perplexity needs a softmax: TF-Hub and "
                             "ELMoForManyLangs models carry none.")
_OUTPUT = flags.DEFINE_string("output_dir", None, "Output directory; default WORKDIR/eval.")
_TRAIN = flags.DEFINE_string("train_file", None,
                             "Train file of the single task given (pos or sentiment); "
                             "sentiment also takes tfds:NAME:SPLIT, pos does not (TFDS has "
                             "no standard POS dataset).")
_TEST = flags.DEFINE_string("test_file", None,
                            "Test file of the single task given (pos or sentiment); "
                            "sentiment also takes tfds:NAME:SPLIT.")
_PROBE_DIR = flags.DEFINE_string("probe_data_dir", None,
                                 "Directory of the probe sets: wsd/wsd.tsv, pos/{train,test}.conll, "
                                 "sentiment/{train,test}.tsv (none ship with the code); the per-file "
                                 "flags override it.")
_WSD = flags.DEFINE_string("wsd_file", None,
                           "WSD TSV: lemma, pos, sense, token_index, sentence.")
_WSD_TRAIN = flags.DEFINE_string("wsd_train_file", None,
                                 "Optional WSD TSV for the sense-centroid protocol.")
_WSD_LEMMA = flags.DEFINE_string("wsd_lemma", None, "Lemma of the WSD PCA plot.")
_POS_TRAIN = flags.DEFINE_string("pos_train_file", None,
                                "CoNLL word<TAB>TAG (a file: TFDS has no standard POS dataset).")
_POS_TEST = flags.DEFINE_string("pos_test_file", None,
                                "CoNLL word<TAB>TAG (a file: TFDS has no standard POS dataset).")
_SENT_TRAIN = flags.DEFINE_string("sentiment_train_file", None,
                                  "TSV label<TAB>sentence, or tfds:NAME:SPLIT "
                                  "(e.g. tfds:glue/sst2:train).")
_SENT_TEST = flags.DEFINE_string("sentiment_test_file", None,
                                 "TSV label<TAB>sentence, or tfds:NAME:SPLIT "
                                 "(e.g. tfds:glue/sst2:validation; sst2's test is unlabelled).")
_TFDS_DIR = flags.DEFINE_string("tfds_data_dir", None,
                                "TFDS data_dir of tfds:NAME:SPLIT inputs and --tfds_name; "
                                "default TFDS's own. Datasets are never downloaded here.")
_TFDS_TEXT = flags.DEFINE_string("tfds_text_key", None,
                                 "Text feature of tfds: sentiment data; default sentence, "
                                 "else text.")
_TFDS_LABEL = flags.DEFINE_string("tfds_label_key", None,
                                  "Integer label feature of tfds: sentiment data; default label.")
_MAX = flags.DEFINE_integer("max_examples", None,
                            "Use only the first N sentences/rows of each file (quick runs).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences per embedder call.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the probes and of the untrained twin.")
_NO_CACHE = flags.DEFINE_bool("no_cache", False, "Do not read/write OUT/cache.")
_MAX_EPOCHS = flags.DEFINE_integer("probe_max_epochs", 60, "Probe epoch limit.")
_PROBE_LR = flags.DEFINE_float("probe_learning_rate", 1e-2, "Probe Adam learning rate.")
# Perplexity; None means "the workdir's training config, else the built-in default".
_TEXT = flags.DEFINE_string("text_file", None,
                            "Perplexity text, one sentence per line (.gz ok; comma-separated "
                            "files) or a directory made by `elmo-jax prepare`; default: "
                            "the workdir config's data.eval_files.")
_TFDS_NAME = flags.DEFINE_string("tfds_name", None, "Perplexity on a TFDS dataset (e.g. lm1b).")
_TFDS_SPLIT = flags.DEFINE_string("tfds_split", "test", "Split of --tfds_name.")
_VOCAB = flags.DEFINE_string("vocab_file", None,
                             "Vocabulary of the softmax; default WORKDIR/vocab.txt or vocab.txt "
                             "next to --weight_file (vocab_counts.tsv beside it feeds unigram_ppl).")
_UNROLL = flags.DEFINE_integer("unroll_steps", None,
                               "Perplexity window length; default the run's, else 20.")
_MAX_BATCHES = flags.DEFINE_integer("max_batches", 0, "Perplexity batches to score; 0 = all.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Progress bars on stderr (--noprogress: none; off "
                               "anyway when stderr is not a terminal).")
_PRETOK = flags.DEFINE_bool("pretokenized", None,
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
  if not _MODEL.value:
    return None
  if _WORKDIR.value or _OPTIONS.value or _WEIGHTS.value:
    raise readers.InputError("give one of --model, --workdir or --options_file/--weight_file")
  return resolve.resolve_model(_MODEL.value)


def _check_numbers() -> None:
  """Counts and rates of the flags, before any work (a download, a model load, a probe trained for 0
  epochs): one line naming the flag."""
  cli.check_flag_numbers(readers.InputError,
                         at_least=[(_MAX_EPOCHS, 1), (_BATCH, 1), (_MAX_BATCHES, 0), (_MAX, 1), (_UNROLL, 1)],
                         within=[(_PROBE_LR, "a number > 0", lambda x: x > 0)])


def config_from_flags() -> tuple[str, tasks_lib.EvalConfig]:
  """Validates flag combinations; returns (task, config)."""
  task = _TASK.value
  _check_numbers()
  model = _resolved_model()
  if task is None:
    raise readers.InputError("--task is required: one of " + ", ".join(_TASK_NAMES))
  if bool(_OPTIONS.value) != bool(_WEIGHTS.value):
    raise readers.InputError("--options_file and --weight_file go together")
  if _WORKDIR.value and _OPTIONS.value:
    raise readers.InputError("give either --workdir or --options_file/--weight_file")
  for path in (_OPTIONS.value, _WEIGHTS.value):
    if path and not os.path.isfile(path):
      raise readers.InputError(f"{path}: file not found")
  output_dir = _OUTPUT.value or (storage.join(_WORKDIR.value, run_layout.EVAL_DIR) if _WORKDIR.value
                                 else None)
  if not output_dir:
    raise readers.InputError("--output_dir is required without --workdir")
  probe = tasks_lib.probes.ProbeConfig(seed=_SEED.value, max_epochs=_MAX_EPOCHS.value,
                                       learning_rate=_PROBE_LR.value)
  found = tasks_lib.probe_files(_PROBE_DIR.value)
  given = lambda flag, key: flag.value or found[key]  # noqa: E731
  cfg = tasks_lib.EvalConfig(
      output_dir=output_dir, workdir=_local_workdir(), wsd_file=given(_WSD, "wsd_file"),
      wsd_train_file=_WSD_TRAIN.value, wsd_lemma=_WSD_LEMMA.value,
      pos_train_file=given(_POS_TRAIN, "pos_train_file"),
      pos_test_file=given(_POS_TEST, "pos_test_file"),
      sentiment_train_file=given(_SENT_TRAIN, "sentiment_train_file"),
      sentiment_test_file=given(_SENT_TEST, "sentiment_test_file"),
      tfds_data_dir=_TFDS_DIR.value, tfds_text_key=_TFDS_TEXT.value,
      tfds_label_key=_TFDS_LABEL.value, max_examples=_MAX.value, batch_size=_BATCH.value,
      use_cache=not _NO_CACHE.value, probe=probe)
  cfg.perplexity = tasks_lib.perplexity.PerplexityConfig(
      text_file=_TEXT.value, tfds_name=_TFDS_NAME.value, tfds_split=_TFDS_SPLIT.value,
      tfds_data_dir=_TFDS_DIR.value,
      options_file=_OPTIONS.value, weight_file=_WEIGHTS.value, model=model, vocab_file=_VOCAB.value,
      # --batch_size defaults to 64 for the probes; perplexity matches the run's batch unless given.
      batch_size=_BATCH.value if _BATCH.present else None, unroll_steps=_UNROLL.value,
      max_batches=_MAX_BATCHES.value, pretokenized=_PRETOK.value)
  if _VOCAB.value and not os.path.isfile(_VOCAB.value):
    raise readers.InputError(f"{_VOCAB.value}: file not found")
  if _TRAIN.value or _TEST.value:
    if task not in ("pos", "sentiment"):
      raise readers.InputError("--train_file/--test_file need --task=pos or --task=sentiment")
    if _TRAIN.value:
      setattr(cfg, f"{task}_train_file", _TRAIN.value)
    if _TEST.value:
      setattr(cfg, f"{task}_test_file", _TEST.value)
  for field in ("pos_train_file", "pos_test_file", "sentiment_train_file",
                "sentiment_test_file", "wsd_file", "wsd_train_file"):
    _check_tfds(field, getattr(cfg, field))
  return task, cfg


def _local_workdir() -> str | None:
  """--workdir, or for a bucket workdir a local copy of what evaluation reads (`run_layout.RUN_FILES`); a
  bucket run without an export yet is named as such (not by its local copy's missing file)."""
  if not _WORKDIR.value or not storage.is_remote(_WORKDIR.value):
    return _WORKDIR.value or None
  local = storage.local(_WORKDIR.value, names=run_layout.RUN_FILES)
  if not all(os.path.isfile(os.path.join(local, rel)) for rel in run_layout.export_files()):
    raise readers.InputError(f"--workdir={_WORKDIR.value} holds no {run_layout.EXPORT_DIR}/ yet: a run exports "
                             "its model at every checkpoint save; evaluate it after its first one")
  return local


def load_models_from_flags(model: ResolvedModel | None = None) -> tasks_lib.Models:
  """Builds the real Embedder and its untrained twin; `model`: what --model resolved to (resolved here if None)."""
  if _WORKDIR.value:
    workdir = _local_workdir()
    emb = Embedder.from_workdir(workdir, warm=False)  # a script: each shape compiles when first met
    key = features.model_key_from_workdir(workdir)
    description = {"workdir": _WORKDIR.value}
  elif _MODEL.value:
    model = model or _resolved_model()
    emb = Embedder.from_model(model, warm=False)
    key = features.model_key_from_paths(emb.input_files)
    description = {"model": _MODEL.value}
  elif _OPTIONS.value:
    emb = Embedder.from_files(_OPTIONS.value, _WEIGHTS.value, warm=False)
    key = features.model_key_from_files(_OPTIONS.value, _WEIGHTS.value)
    description = {"options_file": _OPTIONS.value, "weight_file": _WEIGHTS.value}
  else:
    raise readers.InputError("give --workdir, --model, or --options_file and --weight_file")
  twin = emb.untrained_twin(seed=_SEED.value)
  # The twin is a function of the config and the seed only.
  twin_key = hashlib.sha256((json.dumps(emb.options, sort_keys=True)
                             + f"|seed={_SEED.value}").encode()).hexdigest()[:16]
  description["n_layers"] = emb.n_layers
  return tasks_lib.Models(emb, twin, key, twin_key, description)


def main(argv: Sequence[str],
         load_models: Callable[[], tasks_lib.Models] | None = None) -> None:
  """Entry point; `load_models` lets tests inject a stand-in embedder."""
  if len(argv) > 1:
    sys.exit(f"evaluate.py: unexpected arguments: {' '.join(argv[1:])}")
  if not _PROGRESS.value:
    progress.set_enabled(False)
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # JAX's backend INFO lines would bury the one-line errors
  try:
    task, cfg = config_from_flags()
    # A bucket --output_dir: written locally, each file uploaded whole once every task finished.
    with storage.staged_output(cfg.output_dir, "--output_dir", directory=True,
                               inputs=outputs.input_files(cfg)) as cfg.output_dir:
      tasks_lib.run(task, cfg, load_models or functools.partial(load_models_from_flags, cfg.perplexity.model),
                    on_start=_announce)
  except (readers.InputError, files.UnsafeOutputError, tasks_lib.TaskUnavailable, OptionsError, WeightFileError,
          OSError) as e:
    sys.exit(f"evaluate.py: error: {e}")


def _announce() -> None:
  devices.announce()


def run() -> None:
  cli.run_main(main)


if __name__ == "__main__":
  run()
