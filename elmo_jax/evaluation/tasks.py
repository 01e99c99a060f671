"""The evaluation tasks and their dispatch table.

Each task reads (and validates) its data before asking for the models, so bad
input fails fast without loading weights. A task returns a JSON-able dict with
`trained`/`untrained` scores and the paths of the plots it wrote.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import numpy as np

from elmo_jax.runtime import files
from elmo_jax.evaluation import features, outputs, perplexity, plots, probes, readers, report, wsd
from elmo_jax.evaluation.config import EvalConfig

# Where each probe file sits under --probe_data_dir. Probe sets are research data: none ships here.
PROBE_FILES = {
    "wsd_file": os.path.join("wsd", "wsd.tsv"),
    "pos_train_file": os.path.join("pos", "train.conll"),
    "pos_test_file": os.path.join("pos", "test.conll"),
    "sentiment_train_file": os.path.join("sentiment", "train.tsv"),
    "sentiment_test_file": os.path.join("sentiment", "test.tsv"),
}
# What supplies each task's data: the line `--task=all` prints when it skips the task.
SOURCES = {
    "wsd": "--wsd_file=TSV (lemma, pos, sense, token_index, sentence) or --probe_data_dir=DIR with wsd/wsd.tsv",
    "pos": "--pos_train_file and --pos_test_file (CoNLL word<TAB>TAG; TFDS has no standard POS dataset) "
           "or --probe_data_dir=DIR with pos/train.conll, pos/test.conll",
    "sentiment": "--sentiment_train_file=tfds:glue/sst2:train --sentiment_test_file=tfds:glue/sst2:validation "
                 "(TFDS glue/sst2, prepared offline) or TSV label<TAB>sentence files, or --probe_data_dir=DIR "
                 "with sentiment/train.tsv, sentiment/test.tsv",
}


def probe_files(probe_data_dir: str | None) -> dict[str, str | None]:
  """The probe files of PROBE_FILES found under `probe_data_dir` (None for those absent)."""
  out: dict[str, str | None] = {k: None for k in PROBE_FILES}
  if probe_data_dir:
    if not os.path.isdir(probe_data_dir):
      raise readers.InputError(f"--probe_data_dir={probe_data_dir}: not a directory")
    for key, rel in PROBE_FILES.items():
      path = os.path.join(probe_data_dir, rel)
      out[key] = path if os.path.exists(path) else None
  return out


class TaskUnavailable(RuntimeError):
  """A task that cannot run in this setup (e.g. not implemented yet)."""


@dataclasses.dataclass
class Models:
  """The model under test, its untrained twin and a cache identity for each."""
  trained: features.EmbedderLike
  untrained: features.EmbedderLike
  key: str            # identity of the trained weights (cache key part)
  untrained_key: str  # identity of the random twin (config + seed)
  description: dict[str, Any] = dataclasses.field(default_factory=dict)


class _LazyModels:
  """Loads the models on first use and only once across tasks."""

  def __init__(self, load: Callable[[], Models]):
    self._load = load
    self._models: Models | None = None

  def __call__(self) -> Models:
    if self._models is None:
      self._models = self._load()
    return self._models


def _cap(items: list, cap: int | None, seed: int = 0) -> list:
  """A seeded random subset of `cap` items, kept in file order.

  The first N would be biased: the sentiment files are sorted by source id,
  which groups the labels.
  """
  if not cap or cap <= 0 or cap >= len(items):
    return items
  keep = np.sort(np.random.default_rng(seed).choice(len(items), cap, replace=False))
  return [items[i] for i in keep]


def _first(items: list, cap: int | None) -> list:
  """The first `cap` items (WSD rows are sorted by lemma, so groups stay whole)."""
  return items if not cap or cap <= 0 else items[:cap]


def _features(cfg: EvalConfig, models: Models, name: str, data_key: str,
              compute: Callable[[features.EmbedderLike], np.ndarray]
              ) -> dict[str, np.ndarray]:
  """{'trained': (N, L, D), 'untrained': (N, L, D)}, via the cache."""
  cache_dir = os.path.join(cfg.output_dir, "cache") if cfg.use_cache else None
  return {
      "trained": features.cached(cache_dir, f"{name}-trained-{models.key}-{data_key}",
                                 lambda: compute(models.trained)),
      "untrained": features.cached(
          cache_dir, f"{name}-untrained-{models.untrained_key}-{data_key}",
          lambda: compute(models.untrained)),
  }


def read_wsd(cfg: EvalConfig) -> tuple[list, list | None]:
  test = _first(readers.read_wsd(cfg.wsd_file), cfg.max_examples)
  train = (_first(readers.read_wsd(cfg.wsd_train_file), cfg.max_examples)
           if cfg.wsd_train_file else None)
  if not wsd.eligible_groups(test):
    raise readers.InputError(f"{cfg.wsd_file}: no lemma with >= 2 senses and >= 2 occurrences")
  return test, train


def run_wsd(cfg: EvalConfig, get_models: Callable[[], Models], data) -> dict[str, Any]:
  """Leave-one-out 1-NN sense probe (+ centroid protocol with a train file)."""
  test, train = data
  models = get_models()

  def extract(rows):
    return lambda emb: features.target_features(
        emb, [r.tokens for r in rows], [r.token_index for r in rows], cfg.batch_size)

  key = features.dataset_key([cfg.wsd_file], cap=cfg.max_examples)
  feats = _features(cfg, models, "wsd", key, extract(test))
  result: dict[str, Any] = {"task": "wsd", "rule": wsd.TIE_RULE,
                            "data": {"file": cfg.wsd_file, "rows": len(test)}}
  for model in ("trained", "untrained"):
    result[model] = wsd.nearest_neighbour(test, feats[model])
  if train is not None:
    train_key = features.dataset_key([cfg.wsd_train_file], cap=cfg.max_examples)
    train_feats = _features(cfg, models, "wsd_train", train_key, extract(train))
    result["centroid"] = {m: wsd.sense_centroids(train, train_feats[m], test, feats[m])
                          for m in ("trained", "untrained")}
    result["data"]["train_file"] = cfg.wsd_train_file
  out = cfg.output_dir
  result["plots"] = [plots.save(plots.layer_scores(result, "WSD 1-NN sense accuracy (ties scored as wrong)"),
                                os.path.join(out, "wsd_layers.png"))]
  label, senses, coords = wsd.pca_example(test, feats["trained"], cfg.wsd_lemma)
  result["pca_lemma"] = label
  result["plots"].append(plots.save(plots.wsd_pca(label, senses, coords), os.path.join(out, "wsd_pca.png")))
  return result


def _label_ids(labels: list[str]) -> dict[str, int]:
  return {label: i for i, label in enumerate(sorted(set(labels)))}


def _probe_both(cfg: EvalConfig, feats: dict[str, np.ndarray], n_train: int,
                y_train: np.ndarray, y_test: np.ndarray, n_classes: int,
                dev_mask: np.ndarray) -> dict[str, Any]:
  out = {}
  for model in ("trained", "untrained"):
    x = feats[model]
    out[model] = probes.probe_all_layers(x[:n_train], y_train, x[n_train:], y_test,
                                         n_classes, dev_mask=dev_mask, config=cfg.probe)
  return out


def _probe_plots(cfg: EvalConfig, task: str, result: dict[str, Any], what: str) -> list[str]:
  out = cfg.output_dir
  return [plots.save(plots.layer_scores(result, f"{task}: {what} per layer (linear probe)"),
                     os.path.join(out, f"{task}_layers.png")),
          plots.save(plots.probe_mix_weights(result, f"{task}: learned scalar-mix weights"),
                     os.path.join(out, f"{task}_mix.png"))]


def read_pos(cfg: EvalConfig) -> tuple[list, list, dict[str, int]]:
  train_all = readers.read_conll(cfg.pos_train_file)
  test = _cap(readers.read_conll(cfg.pos_test_file), cfg.max_examples)
  # The label set comes from the whole train file, so a cap cannot reject a test tag.
  ids = _label_ids([t for s in train_all for t in s.tags])
  readers.check_labels(cfg.pos_test_file, [(t, s.line + j) for s in test
                                           for j, t in enumerate(s.tags)], list(ids))
  return _cap(train_all, cfg.max_examples), test, ids


def run_pos(cfg: EvalConfig, get_models: Callable[[], Models], data) -> dict[str, Any]:
  """Token-level softmax-regression POS probe per layer and on a learned mix."""
  train, test, ids = data
  models = get_models()
  sentences = [s.tokens for s in train] + [s.tokens for s in test]
  key = features.dataset_key([cfg.pos_train_file, cfg.pos_test_file], cap=cfg.max_examples,
                             sample="seeded-0")
  feats = _features(cfg, models, "pos", key,
                    lambda emb: features.token_features(emb, sentences, cfg.batch_size))
  y_train = np.array([ids[t] for s in train for t in s.tags], np.int32)
  y_test = np.array([ids[t] for s in test for t in s.tags], np.int32)
  # Dev split by sentence: tokens of one sentence are not independent.
  sent_dev = probes.dev_split(len(train), cfg.probe.dev_fraction, cfg.probe.seed)
  dev_mask = np.repeat(sent_dev, [len(s.tokens) for s in train])
  result = {"task": "pos", "probe": "softmax regression on standardised token vectors",
            "data": {"train_file": cfg.pos_train_file, "test_file": cfg.pos_test_file,
                     "train_sentences": len(train), "train_tokens": int(len(y_train)),
                     "test_sentences": len(test), "n_tags": len(ids),
                     "majority_baseline": probes.majority_accuracy(y_train, y_test)}}
  result.update(_probe_both(cfg, feats, len(y_train), y_train, y_test, len(ids), dev_mask))
  result["plots"] = _probe_plots(cfg, "pos", result, "token accuracy")
  return result


def _read_labelled(cfg: EvalConfig, path: str) -> list[readers.LabelledSentence]:
  if readers.is_tfds(path):
    return readers.read_tfds_labelled(path, cfg.tfds_data_dir, cfg.tfds_text_key,
                                      cfg.tfds_label_key)
  return readers.read_labelled(path)


def read_sentiment(cfg: EvalConfig) -> tuple[list, list, list, dict[str, int]]:
  train_all = _read_labelled(cfg, cfg.sentiment_train_file)
  test = _cap(_read_labelled(cfg, cfg.sentiment_test_file), cfg.max_examples)
  ids = _label_ids([r.label for r in train_all])
  if len(ids) < 2:
    raise readers.InputError(f"{cfg.sentiment_train_file}: needs >= 2 labels, got {sorted(ids)}")
  readers.check_labels(cfg.sentiment_test_file, [(r.label, r.line) for r in test], list(ids))
  return train_all, _cap(train_all, cfg.max_examples), test, ids


def run_sentiment(cfg: EvalConfig, get_models: Callable[[], Models], data) -> dict[str, Any]:
  """Sentence polarity: mean-pooled vectors per layer / learned mix, logistic regression."""
  train_all, train, test, ids = data
  models = get_models()
  sentences = [r.tokens for r in train] + [r.tokens for r in test]
  paths = [cfg.sentiment_train_file, cfg.sentiment_test_file]
  # A TFDS split is no file to digest: its records (and the keys chosen) key the cache.
  tfds_rows = ({"records": readers.labelled_digest(train_all + test)}
               if any(map(readers.is_tfds, paths)) else {})
  key = features.dataset_key([p for p in paths if not readers.is_tfds(p)],
                             cap=cfg.max_examples, tokenizer=1, sample="seeded-0",
                             **tfds_rows)
  feats = _features(cfg, models, "sentiment", key,
                    lambda emb: features.mean_features(emb, sentences, cfg.batch_size))
  y_train = np.array([ids[r.label] for r in train], np.int32)
  y_test = np.array([ids[r.label] for r in test], np.int32)
  dev_mask = probes.dev_split(len(train), cfg.probe.dev_fraction, cfg.probe.seed)
  result = {"task": "sentiment",
            "probe": "logistic (softmax) regression on standardised mean-pooled vectors",
            "data": {"train_file": cfg.sentiment_train_file,
                     "test_file": cfg.sentiment_test_file, "train": len(train),
                     "test": len(test), "labels": sorted(ids),
                     "majority_baseline": probes.majority_accuracy(y_train, y_test)}}
  result.update(_probe_both(cfg, feats, len(train), y_train, y_test, len(ids), dev_mask))
  result["plots"] = _probe_plots(cfg, "sentiment", result, "accuracy")
  return result


def read_perplexity(cfg: EvalConfig) -> None:
  try:
    perplexity.check(cfg.perplexity, cfg.workdir)
  except (perplexity.NoSoftmax, perplexity.NoText) as e:
    raise TaskUnavailable(str(e)) from None


def run_perplexity(cfg: EvalConfig, get_models: Callable[[], Models], data) -> dict[str, Any]:
  """Held-out LM perplexity of the exported model (its own hdf5 + softmax; no Embedder)."""
  del get_models, data  # the LM is loaded with its softmax by perplexity.run
  try:
    # Unavailable, not bad input: `all` skips it with this note, a lone `perplexity` exits with it.
    return perplexity.run(cfg.perplexity, cfg.workdir, cfg.output_dir)
  except (perplexity.NoSoftmax, perplexity.NoText) as e:
    raise TaskUnavailable(str(e)) from None


# name -> (read: checks and reads the task's data, no model; run: the work).
TASKS: dict[str, tuple[Callable[[EvalConfig], Any], Callable[[EvalConfig, Callable[[], Models], Any],
                                                             dict[str, Any]]]] = {
    "perplexity": (read_perplexity, run_perplexity),
    "wsd": (read_wsd, run_wsd),
    "pos": (read_pos, run_pos),
    "sentiment": (read_sentiment, run_sentiment),
}
_NEEDS = {"wsd": ("wsd_file",), "pos": ("pos_train_file", "pos_test_file"),
          "sentiment": ("sentiment_train_file", "sentiment_test_file")}


def missing_data(name: str, cfg: EvalConfig) -> str | None:
  """Why task `name` has no data configured (the skip line), else None."""
  if name in _NEEDS and not all(getattr(cfg, f) for f in _NEEDS[name]):
    return "no data; pass " + SOURCES[name]
  return None


def _jsonable(obj: Any) -> Any:
  if isinstance(obj, dict):
    return {k: _jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_jsonable(v) for v in obj]
  if isinstance(obj, (np.floating, float)):
    return None if not np.isfinite(obj) else float(obj)
  if isinstance(obj, np.integer):
    return int(obj)
  return obj


def _read_inputs(task: str, names: list[str], cfg: EvalConfig, echo: Callable[[str], None],
                 results: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """{task: its data} of every task in `names` that has data; for `all`, the others go into `results` as
  {"skipped": reason} (a single task raises TaskUnavailable instead)."""
  data: dict[str, Any] = {}
  for name in names:
    try:
      reason = missing_data(name, cfg)
      if reason is not None:
        raise TaskUnavailable(reason)
      data[name] = TASKS[name][0](cfg)
    except TaskUnavailable as e:
      if task != "all":
        raise
      results[name] = {"skipped": str(e)}
      echo(f"{name}: skipped ({e})")
  if not data:
    raise TaskUnavailable("no task has data to run; see the skip lines above")
  return data


def _run_task(name: str, cfg: EvalConfig, get_models: Callable[[], Models], data: Any,
              echo: Callable[[str], None]) -> dict[str, Any]:
  """Runs task `name` on its data, writes OUT/NAME.json, echoes its table; returns the JSON-able result."""
  start = time.time()
  result = TASKS[name][1](cfg, get_models, data)
  if "model" not in result:  # perplexity describes its own LM and needs no Embedder
    models = get_models()
    result["model"] = {**models.description, "key": models.key,
                       "untrained_key": models.untrained_key}
    result["probe_config"] = cfg.probe.as_dict()
  result["seconds"] = round(time.time() - start, 2)
  result = _jsonable(result)
  files.write_text(os.path.join(cfg.output_dir, f"{name}.json"), json.dumps(result, indent=2) + "\n")
  if "trained" in result:
    echo(f"\n{name} ({result['seconds']} s)\n" + report.table(result))
  elif name == "perplexity":
    echo(f"\n{name} ({result['seconds']} s)\n" + perplexity.table(result))
  return result


def run(task: str, cfg: EvalConfig, load_models: Callable[[], Models],
        echo: Callable[[str], None] = print,
        on_start: Callable[[], Any] | None = None) -> dict[str, dict[str, Any]]:
  """Runs one task or `all`; writes OUT/TASK.json (and OUT/report.md for `all`).

  Args:
    task: a key of TASKS or "all".
    cfg: paths and options.
    load_models: builds the Models; called at most once, after inputs are read.
    echo: where the short tables go.
    on_start: called once every input is checked, before any work (the entry point's device line).

  Returns:
    {task: result}; for `all`, tasks without data appear as {"skipped": reason}.

  Raises:
    TaskUnavailable: the single task, or for `all` every task, has no data.
    files.UnsafeOutputError: `cfg.output_dir` cannot be written, or writing it would destroy an input.
  """
  if task != "all" and task not in TASKS:
    raise readers.InputError(f"unknown task {task!r}; choose one of {sorted(TASKS) + ['all']}")
  names = list(TASKS) if task == "all" else [task]
  outputs.check_output_dir(cfg, names + (["all"] if task == "all" else []))
  get_models = _LazyModels(load_models)
  results: dict[str, dict[str, Any]] = {}
  # Every input is read and checked before any work, so a bad file fails in seconds, not after a task.
  data = _read_inputs(task, names, cfg, echo, results)
  if on_start is not None:
    on_start()
  os.makedirs(cfg.output_dir, exist_ok=True)
  for name in names:
    if name in data:
      results[name] = _run_task(name, cfg, get_models, data[name], echo)
  if task == "all":
    ordered = {name: results[name] for name in names}
    path = os.path.join(cfg.output_dir, "report.md")
    files.write_text(path, report.markdown_report(ordered, cfg.output_dir) + "\n")
    echo(f"\nwrote {path}")
  return results
