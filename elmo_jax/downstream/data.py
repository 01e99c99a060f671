"""Task data for the downstream models: splits, vocabularies and length-bucketed batches.

The files are read with `elmo_jax.evaluation.readers` (the probes' formats):
  * pos: CoNLL `word<TAB>TAG`, a blank line between sentences;
  * sentiment: TSV `label<TAB>sentence`, or `tfds:NAME:SPLIT` (`tfds.data_source`, no TensorFlow).
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Iterator, Sequence

import numpy as np

from elmo_jax.data import chars
from elmo_jax.embedding.host_batch import bucket
from elmo_jax.evaluation import readers
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.sources import resolve

TASKS = ("pos", "sentiment")
# The probe layout under --data_dir (probe/task sets are research data: none ships with the code).
LAYOUT = {"pos": {s: os.path.join("pos", f"{s}.conll") for s in ("train", "dev", "test")},
          "sentiment": {s: os.path.join("sentiment", f"{s}.tsv") for s in ("train", "dev", "test")}}
SOURCES = {
    "pos": "--{split}=FILE (CoNLL word<TAB>TAG; TFDS has no standard POS dataset) or --data_dir=DIR "
           "with pos/{split}.conll",
    "sentiment": "--{split}=FILE (TSV label<TAB>sentence), --{split}=tfds:glue/sst2:{tfds} (prepared "
                 "offline) or --data_dir=DIR with sentiment/{split}.tsv",
}
_TFDS_SPLIT = {"train": "train", "dev": "validation", "test": "validation"}
PAD, UNK = "<pad>", "<unk>"
# Time buckets of the task batches: coarse, since every (bucket) shape is one more compile of the train
# and eval steps (tens of seconds on a busy CPU), while padding a BiLSTM step is cheap.
TIME_BUCKETS = (16, 32, 64, 128)


@dataclasses.dataclass
class Split:
  """One split: `tokens[i]` a sentence, `labels[i]` its tag sequence (pos) or label (sentiment)."""
  name: str
  source: str
  tokens: list[tuple[str, ...]]
  labels: list[Any]
  sha256: str
  lines: list[int] = dataclasses.field(default_factory=list)  # file line (TFDS: record) of each sentence
  # train after `hold_out`: {"rows": held out as dev, "of": rows before, "fraction", "labels": label count before}
  held_out: dict[str, Any] | None = None


def _label_set(task: str, labels: Sequence[Any]) -> set[str]:
  return {t for tags in labels for t in tags} if task == "pos" else set(labels)


def resolve_paths(task: str, data_dir: str | None, given: dict[str, str | None]) -> dict[str, str]:
  """{split: path or tfds spec}; the flags win over `data_dir`. A missing train/test split is an error
  naming what supplies it; a missing dev split is None (held out of train by the caller)."""
  out: dict[str, Any] = {}
  if data_dir and not os.path.isdir(data_dir):
    raise readers.InputError(f"--data_dir={data_dir}: not a directory")
  for split in ("train", "dev", "test"):
    path = given.get(split)
    if not path and data_dir:
      candidate = os.path.join(data_dir, LAYOUT[task][split])
      path = candidate if os.path.exists(candidate) else None
    if readers.is_tfds(path) and task != "sentiment":
      raise readers.InputError(f"--{split}={path}: TFDS inputs are for sentiment only (TFDS has no "
                               "standard POS dataset); pass a CoNLL file")
    if not path and split != "dev":
      hint = SOURCES[task].format(split=split, tfds=_TFDS_SPLIT[split])
      raise readers.InputError(f"no {task} {split} split: give {hint}")
    out[split] = path
  return out


def bilm_files(spec: str | None) -> list[str]:
  """The local files (and folder) a `--bilm` spec names, found without loading or downloading anything."""
  if not spec:
    return []
  model = resolve.resolve_model(spec, fetch=False)
  found = [p for p in (model.options_file, model.weight_file, *model.read_files) if p]  # every file of it
  path = os.path.expanduser(spec)
  return ([path] if os.path.isdir(path) else []) + found


def check_outputs(workdir: str, paths: dict[str, str | None], bilm: str | None = None,
                  layer_cache_dir: str | None = None) -> None:
  """`storage.check_output` of the run's outputs before any work: `workdir` (a writable folder, not the biLM's
  folder nor inside a trained run's checkpoints/export) and the results.json, dev_curve.png it gets, and
  `layer_cache_dir`, against the split files `paths` and the biLM's files. One-line UnsafeOutputError."""
  inputs = [p for p in paths.values() if p and not readers.is_tfds(p)] + bilm_files(bilm)
  storage.check_output(workdir, "--workdir", inputs=inputs, directory=True)
  if os.path.isdir(workdir):
    for name in ("results.json", "dev_curve.png"):
      storage.check_output(os.path.join(workdir, name), "--workdir", inputs=inputs)
  if layer_cache_dir:
    storage.check_output(layer_cache_dir, "--layer_cache_dir", inputs=inputs, directory=True)


def read_split(task: str, name: str, path: str, tfds_data_dir: str | None = None) -> Split:
  """Reads one split (one-line `readers.InputError` on bad input)."""
  if task == "pos":
    rows = readers.read_conll(path)
    return Split(name, path, [r.tokens for r in rows], [r.tags for r in rows], files.sha256_file(path),
                 [r.line for r in rows])
  if readers.is_tfds(path):
    rows = readers.read_tfds_labelled(path, tfds_data_dir)
    digest = readers.labelled_digest(rows)
  else:
    rows = readers.read_labelled(path)
    digest = files.sha256_file(path)
  return Split(name, path, [r.tokens for r in rows], [r.label for r in rows], digest, [r.line for r in rows])


def hold_out(train: Split, fraction: float, seed: int = 0) -> tuple[Split, Split]:
  """(train minus a seeded `fraction`, that fraction as dev): when no dev split is given."""
  n = len(train.tokens)
  dev = np.zeros(n, bool)
  n_dev = max(1, int(round(n * fraction)))
  dev[np.random.default_rng(seed).permutation(n)[:n_dev]] = True

  def pick(items: list, keep: bool) -> list:  # the items whose dev flag is `keep`
    return [item for item, is_dev in zip(items, dev) if is_dev == keep]

  source = f"{train.source} (held-out {fraction:g}, seed {seed})"
  task = "pos" if train.labels and isinstance(train.labels[0], tuple) else "sentiment"
  held = {"rows": min(n_dev, n), "of": n, "fraction": fraction, "labels": len(_label_set(task, train.labels))}
  return (Split("train", train.source, pick(train.tokens, False), pick(train.labels, False), train.sha256,
                pick(train.lines, False), held),
          Split("dev", source, pick(train.tokens, True), pick(train.labels, True), train.sha256,
                pick(train.lines, True)))


def subsample_size(total: int, n: int | None) -> int:
  """How many of `total` sentences `subsample(split, n, ...)` keeps."""
  return total if not n or n >= total else n


def subsample(split: Split, n: int | None, seed: int) -> Split:
  """A seeded random `n` sentences of `split`, kept in file order (all when n is None or larger)."""
  if subsample_size(len(split.tokens), n) == len(split.tokens):
    return split
  keep = np.sort(np.random.default_rng(seed).choice(len(split.tokens), n, replace=False))
  return dataclasses.replace(split, tokens=[split.tokens[i] for i in keep],
                             labels=[split.labels[i] for i in keep], lines=[split.lines[i] for i in keep])


def build_vocab(sentences: Sequence[Sequence[str]], min_count: int) -> list[str]:
  """Lower-cased training words seen >= `min_count` times; row 0 `<pad>`, row 1 `<unk>`."""
  counts = collections.Counter(w.lower() for s in sentences for w in s)
  words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
  return [PAD, UNK] + words


def label_ids(task: str, train: Split) -> list[str]:
  """Sorted label (tag) set of the training split."""
  labels = _label_set(task, train.labels)
  if len(labels) < 2:
    held = train.held_out
    rows = "sentences" if task == "pos" else "rows"
    if held and held["labels"] >= 2:  # the file has them: the dev hold-out took the others
      raise readers.InputError(
          f"{train.source}: needs >= 2 labels, got {sorted(labels)} in the {len(train.tokens)} training {rows} "
          f"left after the dev hold-out took {held['rows']} of {held['of']} (--dev_fraction={held['fraction']:g}, "
          f"at least one); give a dev split with --dev=FILE (or --data_dir's {task} dev file), or more "
          f"training {rows}")
    raise readers.InputError(f"{train.source}: needs >= 2 labels, got {sorted(labels)}")
  return sorted(labels)


def check_labels(task: str, split: Split, known: Sequence[str]) -> None:
  """One-line error (file:line) on the first label of `split` not seen in training."""
  if task == "pos":  # CoNLL: token j of a sentence starting at line n is on line n + j
    pairs = [(t, n + j) for tags, n in zip(split.labels, split.lines) for j, t in enumerate(tags)]
  else:
    pairs = list(zip(split.labels, split.lines))
  readers.check_labels(split.source, pairs, known)


@dataclasses.dataclass
class Encoded:
  """A split as arrays: word ids per sentence, label ids, and (frozen ELMo) each sentence's cached biLM
  layers as rows `offsets[i]:offsets[i + 1]` of `layers [n_tokens, n_layers + 1, 2P]`."""
  tokens: list[tuple[str, ...]]
  word_ids: list[np.ndarray]
  labels: list[np.ndarray]
  offsets: np.ndarray
  layers: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.tokens)


def encode(task: str, split: Split, vocab: dict[str, int], labels: dict[str, int]) -> Encoded:
  unk = vocab[UNK]
  word_ids = [np.array([vocab.get(w.lower(), unk) for w in s], np.int32) for s in split.tokens]
  if task == "pos":
    ys = [np.array([labels[t] for t in tags], np.int32) for tags in split.labels]
  else:
    ys = [np.array(labels[y], np.int32) for y in split.labels]
  offsets = np.concatenate([[0], np.cumsum([len(s) for s in split.tokens])]).astype(np.int64)
  return Encoded(list(split.tokens), word_ids, ys, offsets)


def batches(data: Encoded, batch_size: int, *, task: str, char_len: int, bilm_chars: int | None = None,
            rng: np.random.Generator | None = None) -> Iterator[dict[str, np.ndarray]]:
  """Length-bucketed batches: sentences sorted by length (with random tie-breaking and a shuffled batch
  order when `rng` is given), each padded to `batch_size` rows and a `TIME_BUCKETS` time (few shapes).

  Yields {"word_ids" [B, T], "char_ids" [B, T, char_len], "mask" [B, T], "labels" [B, T] or [B],
  "rows" [B] (True for real sentences), "index" [B] (-1 padding), optional "layers" [B, L, T, 2P] (cache),
  optional "bilm_char_ids" [B, T, bilm_chars] (fine-tuning)}.
  """
  n = len(data)
  lengths = np.array([len(t) for t in data.tokens])
  noise = rng.random(n) if rng is not None else np.arange(n) / max(n, 1)
  order = np.lexsort((noise, lengths))
  chunks = [order[i:i + batch_size] for i in range(0, n, batch_size)]
  if rng is not None:
    chunks = [chunks[i] for i in rng.permutation(len(chunks))]
  for chunk in chunks:
    time = bucket(int(lengths[chunk].max()), TIME_BUCKETS)
    out = {"word_ids": np.zeros((batch_size, time), np.int32),
           "mask": np.zeros((batch_size, time), bool),
           "rows": np.zeros((batch_size,), bool), "index": np.full((batch_size,), -1, np.int64),
           "labels": np.zeros((batch_size, time) if task == "pos" else (batch_size,), np.int32)}
    sentences = [data.tokens[i] for i in chunk]
    out["char_ids"] = np.zeros((batch_size, time, char_len), np.int32)
    out["char_ids"][:len(chunk)] = chars.batch_to_ids(sentences, max_chars=char_len, pad_to=time)
    if bilm_chars is not None:
      out["bilm_char_ids"] = np.zeros((batch_size, time, bilm_chars), np.int32)
      out["bilm_char_ids"][:len(chunk)] = chars.batch_to_ids(sentences, max_chars=bilm_chars, pad_to=time)
    if data.layers is not None:
      out["layers"] = np.zeros((batch_size, data.layers.shape[1], time, data.layers.shape[2]), np.float32)
    for row, i in enumerate(chunk):
      k = lengths[i]
      out["word_ids"][row, :k] = data.word_ids[i]
      out["mask"][row, :k] = True
      out["rows"][row] = True
      out["index"][row] = i
      if task == "pos":
        out["labels"][row, :k] = data.labels[i]
      else:
        out["labels"][row] = data.labels[i]
      if data.layers is not None:
        out["layers"][row, :, :k] = np.swapaxes(data.layers[data.offsets[i]:data.offsets[i + 1]], 0, 1)
    yield out
