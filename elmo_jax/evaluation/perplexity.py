"""Held-out perplexity of a trained biLM (the `perplexity` task of evaluate.py).

The model is read back from its exported hdf5 (options + weights + `softmax/W`, `softmax/b`) and run
with the trainer's own jitted eval step (`step.make_eval_step`) over bilm-tf-style batches
(`make_lm_iterator(shuffle=False, num_epochs=1)`), so with the run's batch size and unroll length the
numbers equal the trainer's `eval_ppl` records in `metrics.jsonl`.

The unigram baseline is scored on exactly the forward targets the model predicts (`w1..wn </S>` per
sentence), from the training counts in `vocab_counts.tsv`.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import time
from typing import Any

import jax

from elmo_jax.data import TextSource, TfdsSource, Tokenizer, Vocab, make_lm_iterator
from elmo_jax.data.prepared import PreparedCorpus, make_prepared_iterator
from elmo_jax.data.sources import split_paths
from elmo_jax.evaluation import plots
from elmo_jax.evaluation.readers import InputError
from elmo_jax.formats import weights as weights_lib
from elmo_jax.model import make_model, zero_state
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import CONFIG_FILE, EXPORT_DIR, METRICS_FILE, VOCAB_FILE
from elmo_jax.sources import loaded
from elmo_jax.sources import resolve as resolve_lib
from elmo_jax.sources.resolve import ResolvedModel
from elmo_jax.training import feed, lm_eval, step as step_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BATCH_SIZE = 64
DEFAULT_UNROLL_STEPS = 20
NO_COUNTS_NOTE = ("no vocab_counts.tsv next to the vocabulary {source}: the unigram baseline needs the training "
                  "counts (a run trained from text keeps them beside its vocab.txt; pass "
                  "--vocab_file=WORKDIR/vocab.txt)")


OOV_WARNING_RATE = 0.3  # out-of-domain text measured here runs at ~18% OOV


class NoSoftmax(RuntimeError):
  """The weight file has no trained softmax (e.g. original ELMo weights): no perplexity possible."""


class NoText(RuntimeError):
  """No text to score: `--task=all` skips perplexity with this note, `--task=perplexity` exits."""


@dataclasses.dataclass
class PerplexityConfig:
  """What to score and how; None fields default to the workdir's training config, else the constants."""
  text_file: str | None = None
  tfds_name: str | None = None
  tfds_split: str = "test"
  tfds_data_dir: str | None = None  # default: the run's data.tfds_data_dir
  options_file: str | None = None
  weight_file: str | None = None
  model: ResolvedModel | None = None  # what the command's --model resolved to (`resolve.resolve_model`)
  vocab_file: str | None = None
  batch_size: int | None = None
  unroll_steps: int | None = None
  max_batches: int = 0  # 0 = the whole text
  pretokenized: bool | None = None


@dataclasses.dataclass
class LanguageModel:
  """An exported biLM with its softmax and vocabulary, ready for `score`."""
  options: dict[str, Any]
  params: dict[str, Any]  # {"bilm": ..., "softmax": {"W", "b"}} as the eval step wants it
  vocab: Any  # elmo_jax.data.Vocab
  files: dict[str, str]
  train_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # workdir/config.json or {}


def _check_file(path: str) -> str:
  if not os.path.isfile(path):
    raise InputError(f"{path}: file not found")
  return path


def read_train_config(workdir: str) -> dict[str, Any]:
  """The run's config.json (the trainer writes it at start), or InputError."""
  path = _check_file(os.path.join(workdir, CONFIG_FILE))
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise InputError(f"{path}: not JSON ({e.msg})") from None


def resolve(task_config: PerplexityConfig, workdir: str | None) -> ResolvedModel:
  """Which model is scored, as every reader of a model says it (`resolve.resolve_model`, read by
  `loaded.load_model`): a run's export (its vocab.txt carries the counts, export/ has none), the command's
  `--model` (`task_config.model`) or the --options_file/--weight_file pair; --vocab_file replaces the
  vocabulary. A model without the LM softmax: NoSoftmax, one line saying why."""
  if workdir:
    found = resolve_lib.resolve_model(workdir, use="run", fetch=False)
    vocab = found.vocab_file or os.path.join(workdir, VOCAB_FILE)
  elif task_config.model is not None:
    found = task_config.model
    vocab = found.vocab_file
  elif task_config.options_file and task_config.weight_file:
    found = resolve_lib.resolve_files(task_config.options_file, task_config.weight_file)
    vocab = None
  else:
    raise InputError("perplexity needs --workdir, --model, or --options_file and --weight_file")
  return dataclasses.replace(found, vocab_file=task_config.vocab_file or vocab)


def _softmax_problem(found: ResolvedModel, workdir: str | None) -> NoSoftmax | None:
  """Why `found` cannot be scored (its format carries no LM softmax, or its weights hold none), or None; read
  off the weights' index alone (`loaded.has_softmax`: nothing loaded)."""
  if found.efml_dir is not None:
    if workdir:
      return NoSoftmax(f"{workdir}: an ELMoForManyLangs-style run, whose {EXPORT_DIR}/ is an EFML folder "
                       f"(config.json, *.pkl) without the LM softmax, so it cannot be scored here; its eval_ppl "
                       f"records in {METRICS_FILE} are its perplexity on config.data.eval_files")
    return NoSoftmax(f"{found.efml_dir}: an ELMoForManyLangs release carries no LM softmax (only the encoder and "
                     "token embedder), so it cannot be scored for perplexity")
  if found.tfhub_dir is not None:
    return NoSoftmax(f"{found.tfhub_dir}: a TF-Hub elmo/3 module carries no LM softmax (only the biLM and its "
                     "mix), so it cannot be scored for perplexity")
  try:
    if loaded.has_softmax(found):
      return None
  except weights_lib.WeightFileError as e:
    raise InputError(str(e)) from None
  return NoSoftmax(f"{found.weight_file or found.folder_dir}: has no softmax/W, softmax/b (original ELMo weights "
                   "ship without the LM softmax), so it cannot be scored for perplexity")


def _vocab_file(found: ResolvedModel) -> str:
  """The softmax's words: --vocab_file, the run's, or the model's own (a folder's vocab.txt, the vocab.txt
  beside the weights)."""
  beside = os.path.join(found.folder_dir or os.path.dirname(found.weight_file), VOCAB_FILE)
  return found.vocab_file or beside


def load_language_model(task_config: PerplexityConfig, workdir: str | None) -> LanguageModel:
  """The model of `resolve`, read by the one load (`loaded.load_model`: options, weights with the softmax), and
  its vocabulary; one-line errors for every mismatch."""
  found = resolve(task_config, workdir)
  problem = _softmax_problem(found, workdir)
  if problem is not None:  # before the vocabulary: without a softmax there is nothing to score it with
    raise problem
  try:
    model = loaded.load_model(found)
  except (weights_lib.WeightFileError, FileNotFoundError) as e:
    raise InputError(str(e)) from None
  vocab_file = _check_file(_vocab_file(found))
  try:
    vocab = Vocab.load(vocab_file)
  except (ValueError, FileNotFoundError) as e:
    raise InputError(f"{vocab_file}: {e}") from None
  weights = model.files[1] if len(model.files) > 1 else model.files[0]
  rows = model.softmax["W"].shape[0]
  if rows != len(vocab):
    raise InputError(f"{vocab_file}: {len(vocab)} tokens but the softmax in {weights} has {rows} rows; pass the "
                     "vocabulary the model was trained with")
  paths = {"options_file": found.options_file or found.folder_dir, "weight_file": weights, "vocab_file": vocab_file}
  train_config = read_train_config(workdir) if workdir else {}
  return LanguageModel(model.options, {"bilm": model.params, "softmax": model.softmax}, vocab, paths, train_config)


def default_text(workdir: str | None, train_config: dict[str, Any]) -> tuple[str | None, str | None, str]:
  """(text_files, tfds_name, tfds_split) of the run's eval split; relative paths resolve to the repo."""
  data = train_config.get("data", {}) if workdir else {}
  if data.get("prepared_eval_dir"):
    return data["prepared_eval_dir"], None, "test"
  if data.get("tfds_name") and data.get("tfds_eval_split"):
    return None, data["tfds_name"], data["tfds_eval_split"]
  paths = split_paths(str(data.get("eval_files") or ""))
  if not paths:
    return None, None, "test"
  return ",".join(p if os.path.isabs(p) else os.path.join(REPO, p) for p in paths), None, "test"


def open_source(text_file: str | None, tfds_name: str | None, tfds_split: str, tfds_data_dir: str = ""):
  """A TextSource / TfdsSource, with one-line errors."""

  if tfds_name:
    try:
      return TfdsSource(tfds_name, tfds_split, data_dir=tfds_data_dir or None)
    except ImportError:
      raise InputError(f"--tfds_name={tfds_name}: tensorflow_datasets is not installed; "
                       "export the split to a text file and pass --text_file") from None
    except ValueError as e:
      raise InputError(str(e).splitlines()[0]) from None
  if storage.is_remote(text_file) and "," not in text_file:  # one object or prepared folder: its local copy
    try:
      text_file = storage.local(text_file)
    except FileNotFoundError as e:
      raise InputError(str(e)) from None
  if os.path.isdir(text_file):  # a corpus prepared by `elmo-jax prepare`
    try:
      return PreparedCorpus(text_file)
    except FileNotFoundError as e:
      raise InputError(str(e)) from None
  try:
    return TextSource(split_paths(text_file))
  except FileNotFoundError as e:
    raise InputError(str(e)) from None
  except ValueError as e:
    raise InputError(str(e)) from None


def score(lm: LanguageModel, source, *, batch_size: int, unroll_steps: int, max_batches: int = 0,
          pretokenized: bool = False, dtype: str = "float32", scan_unroll: int = 1,
          max_token_chars: int = 50) -> dict[str, Any]:
  """Forward/backward/mean perplexity with lm_eval.perplexity, plus the unigram baseline on the same targets."""


  devices = jax.devices()
  # All devices when the rows split evenly, else one: evaluation is cheap next to a wrong error.
  mesh = step_lib.make_mesh(devices if batch_size % len(devices) == 0 else devices[:1])
  model = make_model(lm.options, dtype=dtype, unroll=scan_unroll)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  eval_step = step_lib.make_eval_step(model, mesh, replicated)
  params = jax.device_put(lm.params, replicated)
  zero = jax.device_put(zero_state(model.config, batch_size), step_lib.lstm_state_sharding(mesh))
  kw = dict(batch_size=batch_size, unroll_steps=unroll_steps, seed=0, shuffle=False, num_epochs=1,
            process_index=0, process_count=1)
  if isinstance(source, PreparedCorpus):  # its tokenizer settings are the ones it was prepared with
    batches = make_prepared_iterator(source, lm.vocab, **kw)
  else:
    batches = make_lm_iterator(source, lm.vocab, Tokenizer(pretokenized=pretokenized), **kw,
                               max_token_chars=max_token_chars,
                               max_characters_per_token=lm.options["char_cnn"]["max_characters_per_token"])
  tally = lm_eval.UnigramTally(lm_eval.with_progress(batches, len(source), max_batches, "perplexity"), lm.vocab)
  result = lm_eval.perplexity(eval_step, params, zero, tally, lambda b: feed.device_batch(b, mesh),
                              max_batches)
  result.update({**tally.result(), "n_sentences": batches.counters["sentences"],
                 "n_batches": batches.counters["batches"]})
  if lm.vocab.counts is None:
    result["unigram_note"] = NO_COUNTS_NOTE.format(source=lm.vocab.source)
  return result


def table(result: dict[str, Any]) -> str:
  """A short markdown table of the perplexity result."""
  fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
  rows = [("biLM forward", result["ppl_forward"]), ("biLM backward", result["ppl_backward"]),
          ("biLM mean", result["ppl"]), ("unigram", result.get("unigram_ppl"))]
  lines = ["| model | perplexity |", "|---|---|"] + [f"| {n} | {fmt(v)} |" for n, v in rows]
  lines.append(f"\n{result['n_tokens']:,} targets per direction, {result['n_sentences']:,} sentences, "
               f"OOV rate {result['oov_rate']:.2%}")
  if result.get("warning"):
    lines.append(f"WARNING: {result['warning']}")
  if result.get("unigram_note"):
    lines.append(f"unigram: {result['unigram_note']}")
  return "\n".join(lines)


def resolve_text(task_config: PerplexityConfig, workdir: str | None,
                 train_config: dict[str, Any]) -> tuple[str | None, str | None, str]:
  """(text_files, tfds_name, tfds_split) to score: the flags', else the run's eval split; NoText if none."""
  text_file, tfds_name, tfds_split = task_config.text_file, task_config.tfds_name, task_config.tfds_split
  if not text_file and not tfds_name:
    text_file, tfds_name, tfds_split = default_text(workdir, train_config)
  if not text_file and not tfds_name:
    raise NoText("no text to score; pass --text_file=FILE or --tfds_name=lm1b (or a --workdir "
                 "whose config has data.eval_files)")
  return text_file, tfds_name, tfds_split


def check(task_config: PerplexityConfig, workdir: str | None) -> None:
  """The task's inputs, checked without loading anything big: there is text to score, the weights hold a
  softmax (before the text files and the vocabulary are looked for: weights without one cannot be scored
  whatever else is given, and `--task=all` skips the task), the files exist.

  Raises NoText / NoSoftmax (the task cannot run here) or InputError (a bad input).
  """
  train_config = read_train_config(workdir) if workdir else {}
  text_file, _, _ = resolve_text(task_config, workdir, train_config)
  found = resolve(task_config, workdir)
  for path in (found.options_file, found.weight_file):
    if path:
      _check_file(path)
  problem = _softmax_problem(found, workdir)
  if problem is not None:
    raise problem
  for path in split_paths(text_file or ""):
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "manifest.json")):
      raise InputError(f"{path}: a directory but not a prepared corpus (elmo-jax prepare)")
    if path and not glob.has_magic(path) and not os.path.exists(path) and not storage.is_remote(path):
      raise InputError(f"{path}: text file not found")
  _check_file(_vocab_file(found))


def run(task_config: PerplexityConfig, workdir: str | None, output_dir: str) -> dict[str, Any]:
  """The task: resolve inputs, load the LM, score, plot; returns the JSON-able result.

  Args:
    task_config: flags of the task.
    workdir: a training run, or None with task_config.options_file/weight_file.
    output_dir: where the PNGs go (the caller writes perplexity.json).
  """
  start = time.time()
  train_config = read_train_config(workdir) if workdir else {}
  text_file, tfds_name, tfds_split = resolve_text(task_config, workdir, train_config)
  source = open_source(text_file, tfds_name, tfds_split, task_config.tfds_data_dir
                       or train_config.get("data", {}).get("tfds_data_dir", ""))
  lm = load_language_model(task_config, workdir)
  data_cfg = train_config.get("data", {})
  batch_size = task_config.batch_size or train_config.get("batch_size") or DEFAULT_BATCH_SIZE
  unroll = task_config.unroll_steps or train_config.get("unroll_steps") or DEFAULT_UNROLL_STEPS
  pretok = task_config.pretokenized
  if pretok is None:
    pretok = bool(data_cfg.get("pretokenized", False))
  if batch_size < 1 or unroll < 1 or task_config.max_batches < 0:
    raise InputError(f"batch_size={batch_size}, unroll_steps={unroll} must be >= 1 and max_batches >= 0")
  scores = score(lm, source, batch_size=batch_size, unroll_steps=unroll, max_batches=task_config.max_batches,
                 pretokenized=pretok, dtype=train_config.get("dtype", "float32"),
                 scan_unroll=int(train_config.get("scan_unroll", 1)),
                 max_token_chars=int(data_cfg.get("max_token_chars", 50)))
  result: dict[str, Any] = {
      "task": "perplexity", "convention": lm_eval.CONVENTION, **scores,
      "data": {"text_file": text_file, "tfds_name": tfds_name,
               "tfds_split": tfds_split if tfds_name else None, "batch_size": batch_size,
               "unroll_steps": unroll, "max_batches": task_config.max_batches, "pretokenized": pretok},
      "model": {"workdir": workdir, **lm.files, "vocab_size": len(lm.vocab)},
  }
  if result.get("oov_rate", 0.0) >= OOV_WARNING_RATE:
    result["warning"] = (f"{result['oov_rate']:.0%} of the words are out of the model's vocabulary "
                         f"({lm.files['vocab_file']}): all of them are scored as <UNK>, so this perplexity "
                         "says little about the text")
  result["plots"] = []
  metrics = os.path.join(workdir, METRICS_FILE) if workdir else None
  if metrics and os.path.exists(metrics):
    try:
      curves = plots.perplexity_curves(metrics)
      result["plots"].append(plots.save(curves, os.path.join(output_dir, "perplexity_curves.png")))
    except ValueError as e:  # a run that never evaluated: the bar chart still says what we measured
      result["curves_note"] = str(e)
  result["plots"].append(plots.save(plots.perplexity_bars(None, result),
                                    os.path.join(output_dir, "perplexity_bars.png")))
  result["seconds"] = round(time.time() - start, 2)
  return result
