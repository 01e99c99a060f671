"""bilm-tf LM batches from a prepared corpus (`elmo_jax.data.prepare`), built with vectorized numpy.

The same stream as `pipeline.make_lm_iterator` on the raw text (same Grain index order: process shard ->
per-epoch shuffle -> repeat; same per-row continuous streams, windows, `<S>`/`</S>` handling, counters and
`get_state()`), so a prepared run's batches, losses and checkpoints equal the raw-text run's. Python only
walks sentence pieces (~1-2 per row per window); every token is handled by numpy gathers.

With `dedupe_shards=k` the batch comes out already deduplicated for k devices by unique *type id*
(`token_chars` [k, U, C], `fwd_index`/`bwd_index` [B, T], see `data/dedupe.py`) without ever building the
[B, T, C] char arrays: exact, and much cheaper than hashing char rows.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import grain
import numpy as np

from elmo_jax.runtime import log
from elmo_jax.runtime import storage
from elmo_jax.data.pipeline import _STATE_VERSION, check_state, stream_order
from elmo_jax.data.manifest import AGAIN, MANIFEST, PreparedCorpusError, open_verified
from elmo_jax.data.vocab import Vocab
from elmo_jax.data import dedupe as dedupe_lib

_BOS, _EOS = 0, 1  # type ids of <S>, </S> (prepare puts the specials first)


class PreparedCorpus:
  """A prepared directory opened for reading: memory-mapped ids plus the type table.

  Opened through `manifest.open_verified` (manifest format, sizes, sha256 with its per-file cache; see
  there), then the arrays are checked against the manifest's counts. Nothing is written into the directory.

  Attributes:
    manifest: the directory's manifest.json.
    tokens: int32 [n_tokens] type ids (memory-mapped).
    offsets: int64 [n_sentences + 1].
    type_chars: int32 [n_types, C] char ids of every type.
    types: the type strings.

  Raises:
    manifest.NotPreparedError (a FileNotFoundError): no manifest.json.
    manifest.PreparedCorpusError (a PrepareError and an OSError): a damaged directory; one line naming the file.
  """

  def __init__(self, directory: str, *, checksums: bool = True, log_line: Callable[[str], None] = log.info):
    self.directory = os.path.abspath(storage.local(directory))  # a bucket's corpus: its local copy
    manifest = open_verified(self.directory, checksums=checksums, log_line=log_line)
    self.manifest = manifest
    self.settings = manifest["settings"]
    counts = manifest["counts"]
    self.tokens = self._load("tokens.npy", np.int32, (counts["n_tokens"],), mmap_mode="r")
    self.offsets = self._load("offsets.npy", np.int64, (counts["n_sentences"] + 1,))
    self.type_chars = self._load("type_chars.npy", np.uint16, None).astype(np.int32)
    path = os.path.join(self.directory, "types.txt")
    try:
      with open(path, encoding="utf-8") as f:
        self.types = f.read().split("\n")[:-1]
    except (OSError, UnicodeDecodeError) as e:
      raise PreparedCorpusError(f"{path} cannot be read ({str(e).splitlines()[0]}); {AGAIN}") from None
    n_types = counts["n_types"]
    if len(self.types) != n_types or self.type_chars.ndim != 2 or len(self.type_chars) != n_types:
      raise PreparedCorpusError(f"{self.directory}: types.txt has {len(self.types):,} types, type_chars.npy "
                                f"{len(self.type_chars):,}, {MANIFEST} counts {n_types:,}; {AGAIN}")
    if self.offsets[0] != 0 or self.offsets[-1] != counts["n_tokens"] or np.any(np.diff(self.offsets) < 0):
      raise PreparedCorpusError(f"{self.directory}/offsets.npy does not cut tokens.npy into sentences; {AGAIN}")
    width = self.settings["max_characters_per_token"]
    if self.type_chars.shape[1] != width:
      raise PreparedCorpusError(f"{self.directory}/type_chars.npy holds {self.type_chars.shape[1]} char ids per "
                                f"type, {MANIFEST} has settings.max_characters_per_token = {width}; {AGAIN}")
    self.lengths = np.diff(self.offsets).astype(np.int64)
    self.skipped = dict(manifest.get("skipped_lines", {}))
    limit = self.settings["max_token_chars"]
    self._truncated = np.fromiter((len(t) > limit for t in self.types), bool, count=len(self.types))
    if "n_truncated_tokens" in counts:  # the type table is hashed, the manifest cannot be: they must agree
      type_counts = self._load("type_counts.npy", np.int64, (n_types,))
      found = int(type_counts[self._truncated].sum())
      if found != counts["n_truncated_tokens"]:
        raise PreparedCorpusError(
            f"{self.directory}/{MANIFEST} has settings.max_token_chars = {limit}, which cuts {found:,} tokens of "
            f"types.txt, but counts.n_truncated_tokens = {counts['n_truncated_tokens']:,} (the manifest was "
            f"edited after preparing?); {AGAIN}")

  def _load(self, name: str, dtype, shape: tuple[int, ...] | None, mmap_mode: str | None = None) -> np.ndarray:
    """One array of the directory, of the dtype (and shape) the manifest implies; else one line naming it."""
    path = os.path.join(self.directory, name)
    try:
      array = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
      raise PreparedCorpusError(f"{path} is not a readable .npy array ({str(e).splitlines()[0][:120]}); "
                                f"{AGAIN}") from None
    if array.dtype != dtype or (shape is not None and array.shape != shape):
      raise PreparedCorpusError(f"{path} holds {array.dtype} {list(array.shape)}, {MANIFEST} implies "
                                f"{np.dtype(dtype)} {list(shape) if shape else '[n_types, C]'}; {AGAIN}")
    return array

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def vocab(self) -> Vocab:
    """The directory's softmax vocabulary (vocab.txt + vocab_counts.tsv, both hashed in the manifest)."""
    path = os.path.join(self.directory, "vocab.txt")
    try:
      vocab = Vocab.load(path)
    except (OSError, ValueError) as e:
      raise PreparedCorpusError(f"{path} cannot be read as a vocabulary ({str(e).splitlines()[0]}); {AGAIN}") from None
    counts = self.manifest["counts"]
    if (counts.get("vocab_size", len(vocab)) != len(vocab)
        or counts.get("vocab_sha256", vocab.sha256()) != vocab.sha256()):
      raise PreparedCorpusError(f"{path} holds {len(vocab):,} tokens (sha256 {vocab.sha256()[:12]}), {MANIFEST} "
                                f"records counts.vocab_size = {counts.get('vocab_size')}; {AGAIN}")
    return vocab

  def targets(self, vocab: Vocab) -> np.ndarray:
    """int32 [n_types]: the softmax id of each type (cut to max_token_chars like the raw path, OOV -> <UNK>)."""
    limit = self.settings["max_token_chars"]
    return vocab.encode([t[:limit] for t in self.types])

  def truncated(self) -> np.ndarray:
    """bool [n_types]: types longer than max_token_chars (counted in `truncated_tokens`)."""
    return self._truncated.copy()

  def sentence(self, index: int) -> list[str]:
    return [self.types[i] for i in self.tokens[self.offsets[index] : self.offsets[index + 1]]]


class PreparedLMIterator:
  """Iterator over batch dicts of one process; the prepared-corpus twin of `pipeline.LMIterator`."""

  def __init__(self, corpus: PreparedCorpus, order: grain.MapDataset, vocab: Vocab, config: dict[str, Any],
               batch_size: int, unroll_steps: int, stride: int, first_row: int, dedupe_shards: int | None):
    self.corpus = corpus
    self._order = order  # stream position -> sentence index
    self._len = len(order)
    self._lengths = corpus.lengths
    self._offsets = corpus.offsets
    self._tokens = corpus.tokens
    self._targets = corpus.targets(vocab)
    self._trunc = corpus.truncated()
    self._chars = corpus.type_chars
    self._config = config
    self._b, self._u = batch_size, unroll_steps
    self._stride, self._row0 = stride, first_row
    self._dedupe = dedupe_shards
    self._any_trunc = bool(self._trunc.any())
    self._blocks: dict[int, np.ndarray] = {}  # k -> sentence index of positions k * stride + row0 + [0, b)
    self._cur = [-1] * batch_size
    self._pos = [0] * batch_size
    self._sent = [-1] * batch_size  # sentence index row r is reading (-1: none)
    self._done = [False] * batch_size
    self._counts = {"sentences": 0, "tokens": 0, "truncated_tokens": 0, "empty_sentences": 0, "batches": 0}

  @property
  def counters(self) -> dict[str, Any]:
    return {**self._counts, "skipped_lines": dict(self.corpus.skipped)}

  def __iter__(self):
    return self

  def _advance(self, r: int) -> bool:
    k = self._cur[r]
    while True:
      k += 1
      index = k * self._stride + self._row0 + r
      if index >= self._len:
        self._cur[r], self._sent[r], self._done[r] = k, -1, True
        return False
      s = int(self._sentence(k, r))
      if self._lengths[s] == 0:
        self._counts["empty_sentences"] += 1
        continue
      self._cur[r], self._pos[r], self._sent[r] = k, 0, s
      return True

  def _sentence(self, k: int, r: int) -> int:
    """Sentence index at row r's k-th stream position; looked up for all rows of window k at once."""
    block = self._blocks.get(k)
    if block is None:
      if len(self._blocks) > 4 * self._b:  # rows drift apart slowly; keep the recent windows only
        low = min(self._cur)
        self._blocks = {key: v for key, v in self._blocks.items() if key >= low}
      first = k * self._stride + self._row0
      positions = range(first, min(first + self._b, self._len))
      block = self._blocks[k] = np.asarray(self._order._getitems(list(positions)), np.int64)  # pylint: disable=protected-access
    return block[r]

  def _plan(self):
    """Sentence pieces of this window: (row, time, sentence, first step, steps) per piece."""
    pieces = []
    lengths = self._lengths
    for r in range(self._b):
      t = 0
      while t < self._u and not self._done[r]:
        s = self._sent[r]
        if s < 0 or self._pos[r] >= lengths[s] + 1:
          if not self._advance(r):
            break
          s = self._sent[r]
        pos = self._pos[r]
        n = min(int(lengths[s]) + 1 - pos, self._u - t)
        pieces.append((r, t, s, pos, n))
        self._pos[r] = pos + n
        t += n
    return pieces

  def __next__(self) -> dict[str, np.ndarray]:
    if all(self._done):
      raise StopIteration
    pieces = self._plan()
    if not pieces:
      raise StopIteration
    b, u = self._b, self._u
    p = np.asarray(pieces, np.int64)
    self._count_new_sentences(p[p[:, 3] == 0, 2])
    steps = p[:, 4]
    first = np.repeat(np.cumsum(steps) - steps, steps)
    within = np.arange(int(steps.sum())) - first
    row = np.repeat(p[:, 0], steps)
    time = np.repeat(p[:, 1], steps) + within
    i = np.repeat(p[:, 3], steps) + within  # step within the sentence, 0..n
    s = np.repeat(p[:, 2], steps)
    n = self._lengths[s]
    start = self._offsets[s]
    last = max(len(self._tokens) - 1, 0)

    def word(j):  # j-th item of "<S> w1 .. wn </S>" as a type id
      ids = self._tokens[np.clip(start + j - 1, 0, last)]
      return np.where(j == 0, _BOS, np.where(j == n + 1, _EOS, ids)).astype(np.int32)

    fwd_in = np.full([b, u], -1, np.int32)
    bwd_in = np.full([b, u], -1, np.int32)
    fwd_targets = np.zeros([b, u], np.int32)
    bwd_targets = np.zeros([b, u], np.int32)
    weights = np.zeros([b, u], np.float32)
    fwd_in[row, time] = word(i)
    bwd_in[row, time] = word(n + 1 - i)
    fwd_targets[row, time] = self._targets[word(i + 1)]
    bwd_targets[row, time] = self._targets[word(n - i)]
    weights[row, time] = 1.0
    self._counts["batches"] += 1
    out = {"fwd_targets": fwd_targets, "bwd_targets": bwd_targets, "weights": weights}
    if self._dedupe:
      out.update(dedupe_lib.dedupe_type_ids(fwd_in, bwd_in, self._chars, self._dedupe))
    else:
      pad = np.zeros([1, self._chars.shape[1]], np.int32)
      table = np.concatenate([pad, self._chars])  # index 0 = padding
      out["fwd_chars"], out["bwd_chars"] = table[fwd_in + 1], table[bwd_in + 1]
    return out

  def _count_new_sentences(self, sentences: np.ndarray) -> None:
    """Counters of sentences started in this window (a sentence's first piece starts at step 0)."""
    lengths = self._lengths[sentences]
    self._counts["sentences"] += len(sentences)
    self._counts["tokens"] += int(lengths.sum())
    if self._any_trunc and len(sentences):
      starts = np.repeat(self._offsets[sentences] - np.cumsum(lengths) + lengths, lengths)
      ids = self._tokens[starts + np.arange(int(lengths.sum()))]
      self._counts["truncated_tokens"] += int(np.count_nonzero(self._trunc[ids]))

  def get_state(self) -> dict[str, Any]:
    return {"version": _STATE_VERSION, "config": dict(self._config), "cur": list(self._cur),
            "pos": list(self._pos), "counters": dict(self._counts)}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues exactly where the iterator (raw or prepared) that produced `state` stopped."""
    check_state(state, self._config, self._b)
    for r in range(self._b):
      k, pos = int(state["cur"][r]), int(state["pos"][r])
      index = k * self._stride + self._row0 + r
      self._cur[r], self._pos[r] = k, pos
      self._done[r] = index >= self._len
      self._sent[r] = int(self._sentence(k, r)) if k >= 0 and not self._done[r] else -1
    self._counts = {k: int(v) for k, v in state["counters"].items()}


def make_prepared_iterator(corpus: PreparedCorpus, vocab: Vocab, *, batch_size: int, unroll_steps: int, seed: int,
                           shuffle: bool = True, num_epochs: int | None = None, process_index: int | None = None,
                           process_count: int | None = None, shard: str = "sentences",
                           dedupe_shards: int | None = None) -> PreparedLMIterator:
  """`make_lm_iterator`'s arguments and stream, from a `PreparedCorpus` (tokenizer settings come from it)."""
  settings = corpus.settings
  order, stride, first_row, config = stream_order(
      grain.MapDataset.range(len(corpus)), batch_size=batch_size, unroll_steps=unroll_steps, seed=seed,
      shuffle=shuffle, num_epochs=num_epochs, process_index=process_index, process_count=process_count,
      shard=shard, vocab=vocab, pretokenized=settings["tokenizer"]["pretokenized"],
      max_token_chars=settings["max_token_chars"], max_characters_per_token=settings["max_characters_per_token"])
  return PreparedLMIterator(corpus, order, vocab, config, batch_size, unroll_steps, stride, first_row, dedupe_shards)
