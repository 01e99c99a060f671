"""The one LM batch iterator: bilm-tf's training batches from sentences of type ids.

Sentences come as type ids from a prepared corpus (`prepared.PreparedCorpus`) or from raw text tokenized
on the fly (`pipeline.TextTypes`); either way type 0 is `<S>`, type 1 is `</S>`, and each type has its char
ids, its softmax id and whether it was cut to `max_token_chars`. The sentence order is a Grain index
dataset (`stream_order`: process shard -> per-epoch shuffle -> repeat), random access: row `r`
of the batch owns the sentences at stream positions `r, r + stride, r + 2 stride, ...`, and each row is
the concatenation of its sentences, so the trainer carries row r's LSTM state from batch k into k + 1.

Like bilm-tf's `_get_batch`, a sentence `<S> w1 .. wn </S>` contributes the n + 1 inputs `<S> w1 .. wn`
with targets `w1 .. wn </S>` (`</S>` is never an input, so `<S>` is never a target). The backward
direction reads the reversed sentence `</S> wn .. w1 <S>`: inputs `</S> wn .. w1`, targets `wn .. w1 <S>`.
Both directions have n + 1 steps per sentence, so they are cut at the same offsets.

Python walks only sentence pieces (~1-2 per row per window); every token is handled by numpy gathers.
With `dedupe_shards=k` a batch comes out deduplicated for k devices (`token_chars` [k, U, C],
`fwd_index`/`bwd_index` [B, T]): by type id (`dedupe.dedupe_type_ids`, no [B, T, C] char arrays) where the
ids are fixed (a prepared corpus), else by content (`dedupe.dedupe_batch`). XLA:CPU rounds a char-CNN row
by where it sits in the table (~1e-7), so a table's order must be a function of the batch alone: raw
text's type ids depend on the reading order (a resumed run numbers them anew), its table goes by content.
"""
from __future__ import annotations

from typing import Any, Protocol

import grain
import jax
import numpy as np

from elmo_jax.data import dedupe as dedupe_lib
from elmo_jax.data.vocab import Vocab

STATE_VERSION = 1
BOS_TYPE, EOS_TYPE = 0, 1  # type ids of <S>, </S>


class SentenceTypes(Protocol):
  """What the iterator reads: `len()` sentences as type ids, and the type tables (which may grow as raw
  text is tokenized, so they are asked for after a window's sentences are read)."""
  skipped: dict[str, int]
  stable_ids: bool  # the same type ids in every run (a prepared corpus): tables may be ordered by them

  def __len__(self) -> int: ...

  def type_ids(self, index: int) -> np.ndarray:
    """int32 [n_words] of sentence `index` (without `<S>`/`</S>`)."""

  def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(chars [n_types, C], softmax ids int32 [n_types], cut to max_token_chars bool [n_types])."""


class LMIterator:
  """Batch dicts of one process: `{fwd_targets, bwd_targets: int32 [b, U], weights: float32 [b, U]}` plus
  `fwd_chars, bwd_chars: int32 [b, U, C]` (padding: all-0 chars, target 0, weight 0), or with
  `dedupe_shards` the token tables instead of the chars.

  Attributes:
    counters: `sentences`, `tokens` (words, without `<S>`/`</S>`), `truncated_tokens`, `empty_sentences`
      (no tokens) and `batches` consumed so far, plus `skipped_lines` from the source.
  """

  def __init__(self, sentences: SentenceTypes, order: grain.MapDataset, config: dict[str, Any],
               batch_size: int, unroll_steps: int, stride: int, first_row: int, dedupe_shards: int | None = None,
               dedupe_by: str = "type"):
    self.sentences = sentences
    self._order = order  # stream position -> sentence index
    self._len = len(order)  # sys.maxsize when repeating forever
    self._config = config
    self._batch_size = batch_size
    self._unroll_steps = unroll_steps
    self._stride = stride  # row r reads stream positions first_row + r + k * stride, k = 0, 1, ...
    self._first_row = first_row
    self._dedupe = dedupe_shards
    if dedupe_by not in ("type", "content"):
      raise ValueError(f"dedupe_by must be 'type' or 'content', got {dedupe_by!r}")
    self._by_type = dedupe_by == "type" and sentences.stable_ids
    self._blocks: dict[int, np.ndarray] = {}  # k -> sentence index of positions k * stride + first_row + [0, b)
    self._cur = [-1] * batch_size  # ordinal (within the row) of the sentence row r is reading; -1: none yet
    self._pos = [0] * batch_size  # steps of that sentence already emitted
    self._ids: list[np.ndarray | None] = [None] * batch_size  # its type ids
    self._done = [False] * batch_size
    self._counts = {"sentences": 0, "tokens": 0, "truncated_tokens": 0, "empty_sentences": 0, "batches": 0}

  @property
  def counters(self) -> dict[str, Any]:
    return {**self._counts, "skipped_lines": dict(getattr(self.sentences, "skipped", {}) or {})}

  def __iter__(self) -> "LMIterator":
    return self

  def _sentence(self, k: int, r: int) -> int:
    """Sentence index at row r's k-th stream position; looked up for all rows of window k at once."""
    block = self._blocks.get(k)
    if block is None:
      if len(self._blocks) > 4 * self._batch_size:  # rows drift apart slowly; keep the recent windows only
        low = min(self._cur)
        self._blocks = {key: v for key, v in self._blocks.items() if key >= low}
      first = k * self._stride + self._first_row
      positions = list(range(first, min(first + self._batch_size, self._len)))
      block = self._blocks[k] = np.asarray(self._order._getitems(positions), np.int64)  # pylint: disable=protected-access
    return int(block[r])

  def _advance(self, r: int) -> bool:
    """Moves row r to its next non-empty sentence; False once the (finite) stream has none left."""
    k = self._cur[r]
    while True:
      k += 1
      if k * self._stride + self._first_row + r >= self._len:
        self._cur[r] = k
        self._ids[r] = None
        self._done[r] = True
        return False
      ids = self.sentences.type_ids(self._sentence(k, r))
      if not len(ids):
        self._counts["empty_sentences"] += 1
        continue
      self._cur[r] = k
      self._pos[r] = 0
      self._ids[r] = ids
      return True

  def _plan(self) -> tuple[list[tuple[int, int, int, int, int]], list[np.ndarray]]:
    """This window's sentence pieces: (row, time, first step, steps, sentence words) and their sentences' ids."""
    pieces = []
    ids = []
    u = self._unroll_steps
    for r in range(self._batch_size):
      t = 0
      while t < u and not self._done[r]:
        sentence = self._ids[r]
        if sentence is None or self._pos[r] > len(sentence):
          if not self._advance(r):
            break
          sentence = self._ids[r]
        pos = self._pos[r]
        words = len(sentence)
        n = min(words + 1 - pos, u - t)
        pieces.append((r, t, pos, n, words))
        ids.append(sentence)
        self._pos[r] = pos + n
        t += n
    return pieces, ids

  def __next__(self) -> dict[str, np.ndarray]:
    if all(self._done):
      raise StopIteration
    pieces, ids = self._plan()
    if not pieces:  # every row ran out exactly at the previous batch boundary
      raise StopIteration
    chars, targets, truncated = self.sentences.tables()
    p = np.asarray(pieces, np.int64)
    lengths = p[:, 4]
    flat = np.concatenate(ids)
    self._count_new_sentences(p, flat, truncated)
    steps = p[:, 3]
    within = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
    row = np.repeat(p[:, 0], steps)
    time = np.repeat(p[:, 1], steps) + within
    i = np.repeat(p[:, 2], steps) + within  # step within the sentence, 0..n
    n = np.repeat(lengths, steps)
    start = np.repeat(np.cumsum(lengths) - lengths, steps)  # the sentence's first word in `flat`

    def word(j):  # j-th item of "<S> w1 .. wn </S>" as a type id
      inner = flat[np.clip(start + j - 1, 0, len(flat) - 1)]
      return np.where(j == 0, BOS_TYPE, np.where(j == n + 1, EOS_TYPE, inner)).astype(np.int32)

    b = self._batch_size
    u = self._unroll_steps
    fwd_in = np.full([b, u], -1, np.int32)  # input type ids (-1: padding)
    bwd_in = np.full([b, u], -1, np.int32)
    out = {"fwd_targets": np.zeros([b, u], np.int32), "bwd_targets": np.zeros([b, u], np.int32),
           "weights": np.zeros([b, u], np.float32)}
    fwd_in[row, time] = word(i)
    bwd_in[row, time] = word(n + 1 - i)
    out["fwd_targets"][row, time] = targets[word(i + 1)]
    out["bwd_targets"][row, time] = targets[word(n - i)]
    out["weights"][row, time] = 1.0
    self._counts["batches"] += 1
    if self._dedupe and self._by_type:
      return {**out, **dedupe_lib.dedupe_type_ids(fwd_in, bwd_in, chars, self._dedupe)}
    table = np.concatenate([np.zeros([1, chars.shape[1]], np.int32), chars])  # index 0 = padding
    out["fwd_chars"] = table[fwd_in + 1]
    out["bwd_chars"] = table[bwd_in + 1]
    return dedupe_lib.dedupe_batch(out, self._dedupe) if self._dedupe else out

  def _count_new_sentences(self, pieces: np.ndarray, flat: np.ndarray, truncated: np.ndarray) -> None:
    """Counters of the sentences started in this window (a sentence's first piece starts at step 0);
    `flat`: the pieces' sentences' ids, one after another."""
    started = pieces[:, 2] == 0
    lengths = pieces[:, 4]
    self._counts["sentences"] += int(np.count_nonzero(started))
    self._counts["tokens"] += int(lengths[started].sum())
    if started.any() and truncated.any():
      words = np.repeat(started, lengths)  # the started sentences' words in `flat`
      self._counts["truncated_tokens"] += int(np.count_nonzero(truncated[flat[words]]))

  def get_state(self) -> dict[str, Any]:
    """Small JSON-serializable position (2 ints per row + counters + the config it belongs to)."""
    return {"version": STATE_VERSION, "config": dict(self._config), "cur": list(self._cur),
            "pos": list(self._pos), "counters": dict(self._counts)}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues exactly where the iterator that produced `state` (with the same config) stopped."""
    check_state(state, self._config, self._batch_size)
    for r in range(self._batch_size):
      k = int(state["cur"][r])
      self._cur[r] = k
      self._pos[r] = int(state["pos"][r])
      self._done[r] = k * self._stride + self._first_row + r >= self._len
      # Re-read the sentence in progress: the same ids (its types keep their chars and targets).
      self._ids[r] = self.sentences.type_ids(self._sentence(k, r)) if k >= 0 and not self._done[r] else None
    self._counts = {k: int(v) for k, v in state["counters"].items()}


def check_state(state: dict[str, Any], config: dict[str, Any], batch_size: int) -> None:
  """Raises ValueError unless `state` is a position of a stream with this `config` and batch size."""
  if state.get("version") != STATE_VERSION:
    raise ValueError(f"data iterator state version {state.get('version')!r} != {STATE_VERSION}; cannot resume")
  mismatched = {k: (v, config.get(k)) for k, v in state["config"].items() if config.get(k) != v}
  if mismatched or set(state["config"]) != set(config):
    raise ValueError(f"data iterator state was saved with a different config (saved, now): {mismatched}")
  if len(state["cur"]) != batch_size or len(state["pos"]) != batch_size:
    raise ValueError(f"data iterator state has {len(state['cur'])} rows, iterator has batch_size={batch_size}")


def stream_order(ds: grain.MapDataset, *, batch_size: int, unroll_steps: int, seed: int, shuffle: bool,
                 num_epochs: int | None, process_index: int | None, process_count: int | None, shard: str,
                 vocab: Vocab, **settings) -> tuple[grain.MapDataset, int, int, dict[str, Any]]:
  """The sentence order of one process (shard -> per-epoch shuffle -> repeat) over `ds` (len = sentences).

  Returns (ordered dataset, row stride, first row, the stream's config for `get_state`); shared by raw text
  and prepared corpora, so both read the same sentences in the same places.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")
  if batch_size < 1 or unroll_steps < 1:
    raise ValueError(f"batch_size={batch_size} and unroll_steps={unroll_steps} must be >= 1")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs={num_epochs} must be >= 1 or None (repeat forever)")
  if min(vocab.bos, vocab.eos, vocab.unk) < 0:
    raise ValueError("training vocab must contain <S>, </S> and <UNK>; load it with require_specials=True")
  if len(ds) < process_count:
    raise ValueError(f"source has {len(ds)} sentences, fewer than process_count={process_count} shards")
  if shard not in ("sentences", "rows"):
    raise ValueError(f"shard must be 'sentences' or 'rows', got {shard!r}")
  n = len(ds)
  if shard == "sentences":  # each process its own sentences, in rows 0 .. batch_size - 1 of its stream
    ds = ds[process_index::process_count]
    stride = batch_size
    first_row = 0
  else:  # every process the whole stream, its own rows of each window
    stride = batch_size * process_count
    first_row = batch_size * process_index
  if shuffle:
    ds = ds.shuffle(seed=seed % 2**32)
  ds = ds.repeat(num_epochs)  # after shuffle, so each epoch gets its own permutation
  config = {"batch_size": batch_size, "unroll_steps": unroll_steps, "seed": seed, "shuffle": shuffle,
            "num_epochs": num_epochs, "process_index": process_index, "process_count": process_count,
            "source_len": n, "vocab_sha256": vocab.sha256(), **settings}
  if shard != "sentences":  # only when set, so states saved before this option existed still load
    config["shard"] = shard
  return ds, stride, first_row, config
