"""bilm-tf's training batches (continuous per-row sentence streams cut into windows) on top of Grain.

The sentence order comes from a Grain `MapDataset` (process shard -> per-epoch shuffle -> repeat ->
tokenize/encode), which is random access: row `r` of the batch owns the sentences at positions
`r, r + b, r + 2b, ...` of this process's stream. Each row is the concatenation of its sentences, so the
trainer can carry the LSTM state of row `r` from batch `k` into batch `k + 1`.

Like bilm-tf's `_get_batch`, a sentence `<S> w1 .. wn </S>` contributes the n + 1 inputs `<S> w1 .. wn`
with targets `w1 .. wn </S>` (`</S>` is never an input, so `<S>` is never a target). The backward
direction uses the reversed sentence `</S> wn .. w1 <S>`: inputs `</S> wn .. w1`, targets `wn .. w1 <S>`
(the previous word of the original). Both directions have n + 1 steps per sentence, so they are cut at
the same offsets and the windows of both directions cover the same sentences.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import grain
import jax
import numpy as np

from elmo_jax.data.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, CharIdCache
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.data.vocab import Vocab

_STATE_VERSION = 1


@dataclasses.dataclass
class _Encoded:
  """One sentence as both directions need it (n = number of words)."""

  chars: np.ndarray  # [n + 2, max_chars] int32, <S> .. </S>
  ids: np.ndarray  # [n + 2] int32
  n_words: int
  n_truncated: int

  @property
  def n_steps(self) -> int:
    return self.n_words + 1


class _Encode:
  """Grain map: text -> `_Encoded` (or None for a sentence without tokens). Pure, so re-reads are safe."""

  def __init__(self, tokenizer: Tokenizer, vocab: Vocab, max_token_chars: int, max_characters_per_token: int):
    self.tokenizer = tokenizer
    self.vocab = vocab
    self.max_token_chars = max_token_chars
    self.cache = CharIdCache(max_characters_per_token)
    self._bos = self.cache(BOS_TOKEN)
    self._eos = self.cache(EOS_TOKEN)

  def __call__(self, text: str) -> _Encoded | None:
    tokens = self.tokenizer(text)
    if not tokens:
      return None
    n_truncated = 0
    limit = self.max_token_chars
    for i, token in enumerate(tokens):
      if len(token) > limit:  # e.g. URLs or tables glued into one token; they would only be <UNK> anyway
        tokens[i] = token[:limit]
        n_truncated += 1
    cache = self.cache
    chars = np.stack([self._bos, *(cache(t) for t in tokens), self._eos])
    ids = np.empty([len(tokens) + 2], dtype=np.int32)
    ids[0], ids[-1] = self.vocab.bos, self.vocab.eos
    ids[1:-1] = self.vocab.encode(tokens)
    return _Encoded(chars, ids, len(tokens), n_truncated)


class LMIterator(Iterator[dict[str, np.ndarray]]):
  """Iterator over batch dicts of one process; see `make_lm_iterator`.

  Attributes:
    counters: `sentences`, `tokens` (words, without `<S>`/`</S>`), `truncated_tokens`, `empty_sentences`
      (no tokens after tokenization) consumed so far, plus `skipped_lines` from the source.
  """

  def __init__(
      self,
      dataset: grain.MapDataset,
      source: Sequence[str],
      config: dict[str, Any],
      batch_size: int,
      unroll_steps: int,
      max_characters_per_token: int,
      stride: int | None = None,
      first_row: int = 0,
  ):
    self._ds = dataset
    # Row r reads stream positions first_row + r + k * stride (stride = rows of the whole stream).
    self._stride, self._row0 = stride or batch_size, first_row
    self._len = len(dataset)  # sys.maxsize when repeating forever
    self._source = source
    self._config = config
    self._b, self._u, self._c = batch_size, unroll_steps, max_characters_per_token
    self._cur = [-1] * batch_size  # ordinal (within the row) of the sentence row r is reading; -1 = none yet
    self._pos = [0] * batch_size  # steps of that sentence already emitted
    self._sent: list[_Encoded | None] = [None] * batch_size
    self._done = [False] * batch_size
    self._counts = {"sentences": 0, "tokens": 0, "truncated_tokens": 0, "empty_sentences": 0, "batches": 0}

  @property
  def counters(self) -> dict[str, Any]:
    return {**self._counts, "skipped_lines": dict(getattr(self._source, "skipped", {}))}

  def __iter__(self) -> "LMIterator":
    return self

  def _advance(self, r: int) -> bool:
    """Moves row r to its next non-empty sentence; False once the (finite) stream has none left."""
    k = self._cur[r]
    while True:
      k += 1
      index = k * self._stride + self._row0 + r
      if index >= self._len:
        self._cur[r], self._sent[r], self._done[r] = k, None, True
        return False
      sentence = self._ds[index]
      if sentence is None:
        self._counts["empty_sentences"] += 1
        continue
      self._cur[r], self._pos[r], self._sent[r] = k, 0, sentence
      self._counts["sentences"] += 1
      self._counts["tokens"] += sentence.n_words
      self._counts["truncated_tokens"] += sentence.n_truncated
      return True

  def __next__(self) -> dict[str, np.ndarray]:
    b, u = self._b, self._u
    if all(self._done):
      raise StopIteration
    fwd_chars = np.zeros([b, u, self._c], dtype=np.int32)
    bwd_chars = np.zeros([b, u, self._c], dtype=np.int32)
    fwd_targets = np.zeros([b, u], dtype=np.int32)
    bwd_targets = np.zeros([b, u], dtype=np.int32)
    weights = np.zeros([b, u], dtype=np.float32)
    for r in range(b):
      t = 0
      while t < u and not self._done[r]:
        sentence = self._sent[r]
        if sentence is None or self._pos[r] >= sentence.n_steps:
          if not self._advance(r):
            break
          sentence = self._sent[r]
        pos = self._pos[r]
        n = min(sentence.n_steps - pos, u - t)
        fwd_chars[r, t : t + n] = sentence.chars[pos : pos + n]
        fwd_targets[r, t : t + n] = sentence.ids[pos + 1 : pos + 1 + n]
        # Reversed sentence: step i reads original index (n_words + 1 - i), targets original (n_words - i).
        end = sentence.n_words + 1 - pos
        bwd_chars[r, t : t + n] = sentence.chars[end - n + 1 : end + 1][::-1]
        bwd_targets[r, t : t + n] = sentence.ids[end - n : end][::-1]
        weights[r, t : t + n] = 1.0
        self._pos[r] = pos + n
        t += n
    if not weights.any():  # every row ran out exactly at the previous batch boundary
      raise StopIteration
    self._counts["batches"] += 1
    return {
        "fwd_chars": fwd_chars,
        "fwd_targets": fwd_targets,
        "bwd_chars": bwd_chars,
        "bwd_targets": bwd_targets,
        "weights": weights,
    }

  def get_state(self) -> dict[str, Any]:
    """Small JSON-serializable position (2 ints per row + counters + the config it belongs to)."""
    return {
        "version": _STATE_VERSION,
        "config": dict(self._config),
        "cur": list(self._cur),
        "pos": list(self._pos),
        "counters": dict(self._counts),
    }

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues exactly where the iterator that produced `state` (with the same config) stopped."""
    check_state(state, self._config, self._b)
    for r in range(self._b):
      k, pos = int(state["cur"][r]), int(state["pos"][r])
      self._cur[r], self._pos[r] = k, pos
      index = k * self._stride + self._row0 + r
      self._done[r] = index >= self._len
      # Re-read the sentence in progress; the map is pure, so it encodes to the same arrays.
      self._sent[r] = self._ds[index] if k >= 0 and not self._done[r] else None
    self._counts = {k: int(v) for k, v in state["counters"].items()}


def check_state(state: dict[str, Any], config: dict[str, Any], batch_size: int) -> None:
  """Raises ValueError unless `state` is a position of a stream with this `config` and batch size."""
  if state.get("version") != _STATE_VERSION:
    raise ValueError(f"data iterator state version {state.get('version')!r} != {_STATE_VERSION}; cannot resume")
  mismatched = {k: (v, config.get(k)) for k, v in state["config"].items() if config.get(k) != v}
  if mismatched or set(state["config"]) != set(config):
    raise ValueError(f"data iterator state was saved with a different config (saved, now): {mismatched}")
  if len(state["cur"]) != batch_size or len(state["pos"]) != batch_size:
    raise ValueError(f"data iterator state has {len(state['cur'])} rows, iterator has batch_size={batch_size}")


def stream_order(ds: grain.MapDataset, *, batch_size: int, unroll_steps: int, seed: int, shuffle: bool,
                 num_epochs: int | None, process_index: int | None, process_count: int | None, shard: str,
                 vocab: Vocab, **settings) -> tuple[grain.MapDataset, int, int, dict[str, Any]]:
  """The sentence order of one process (shard -> per-epoch shuffle -> repeat) over `ds` (len = sentences).

  Returns (ordered dataset, row stride, first row, the stream's config for `get_state`); shared by the raw
  and the prepared pipelines, so both read the same sentences in the same places.
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
  stride, first_row = batch_size, 0
  if shard == "sentences":
    ds = ds[process_index::process_count]
  else:
    stride, first_row = batch_size * process_count, batch_size * process_index
  if shuffle:
    ds = ds.shuffle(seed=seed % 2**32)
  ds = ds.repeat(num_epochs)  # after shuffle, so each epoch gets its own permutation
  config = {"batch_size": batch_size, "unroll_steps": unroll_steps, "seed": seed, "shuffle": shuffle,
            "num_epochs": num_epochs, "process_index": process_index, "process_count": process_count,
            "source_len": n, "vocab_sha256": vocab.sha256(), **settings}
  if shard != "sentences":  # only when set, so states saved before this option existed still load
    config["shard"] = shard
  return ds, stride, first_row, config


def make_lm_iterator(
    source: Sequence[str],
    vocab: Vocab,
    tokenizer: Tokenizer,
    *,
    batch_size: int,
    unroll_steps: int,
    seed: int,
    shuffle: bool = True,
    num_epochs: int | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    max_token_chars: int = 50,
    max_characters_per_token: int = MAX_CHARS,
    shard: str = "sentences",
) -> LMIterator:
  """Builds the bilm-tf batch iterator for this process's shard of `source`.

  Args:
    source: random-access sentences (`TextSource`, `TfdsSource`, or a list of str).
    vocab: maps target words to softmax ids.
    tokenizer: raw text -> tokens.
    batch_size: rows per batch of THIS process (global batch / process count).
    unroll_steps: time steps per window.
    seed: shuffle seed; epoch e uses a permutation derived from (seed, e).
    shuffle: False keeps source order (evaluation).
    num_epochs: None repeats forever; an int ends after that many passes, padding rows that ran out.
    process_index, process_count: shard this process reads (`source[process_index::process_count]`);
      default `jax.process_index()` / `jax.process_count()`.
    max_token_chars: longer tokens are cut to this many characters (counted in `truncated_tokens`).
    max_characters_per_token: char ids per token (the model's `max_characters_per_token`).
    shard: how processes split the data. "sentences": process p reads `source[p::P]` into its own
      `batch_size` rows. "rows": every process walks the same shuffled stream of all of `source`, laid
      out over `P * batch_size` global rows, and process p produces global rows
      `[p * batch_size, (p + 1) * batch_size)`; the global batch is then the same for any process count
      (what a 1-process run would see), at no extra cost since the stream is random access.

  Returns:
    An `LMIterator` yielding `{"fwd_chars": int32 [b, U, 50], "fwd_targets": int32 [b, U],
    "bwd_chars": int32 [b, U, 50], "bwd_targets": int32 [b, U], "weights": float32 [b, U]}`; padded steps
    have all-0 chars, target 0 and weight 0.
  """
  if max_token_chars < 1:
    raise ValueError(f"max_token_chars={max_token_chars} must be >= 1")
  ds, stride, first_row, config = stream_order(
      grain.MapDataset.source(source), batch_size=batch_size, unroll_steps=unroll_steps, seed=seed,
      shuffle=shuffle, num_epochs=num_epochs, process_index=process_index, process_count=process_count,
      shard=shard, vocab=vocab, pretokenized=getattr(tokenizer, "pretokenized", None),
      max_token_chars=max_token_chars, max_characters_per_token=max_characters_per_token)
  ds = ds.map(_Encode(tokenizer, vocab, max_token_chars, max_characters_per_token))
  return LMIterator(ds, source, config, batch_size, unroll_steps, max_characters_per_token, stride, first_row)
