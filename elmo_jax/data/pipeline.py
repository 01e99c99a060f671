"""Raw text (or TFDS) as sentences of type ids, tokenized on the fly, into the one batch iterator
(`batches.LMIterator`): the same ids, batches and positions as the text's prepared corpus
(`prepared.py`), without preparing it first.
"""
from __future__ import annotations

from typing import Sequence

import grain
import numpy as np

from elmo_jax.data.batches import LMIterator, stream_order
from elmo_jax.data.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, is_cut, token_to_ids
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.data.vocab import Vocab


class TextTypes:
  """`batches.SentenceTypes` of random-access text: each line tokenized when the iterator reads it.

  A type is a distinct token, numbered as first met after `<S>` (0) and `</S>` (1); its chars and softmax
  id are those of the token cut to `max_token_chars` (as `prepare` stores them). The numbering depends on
  the reading order, so the batches never show it (a deduped table goes by content, see `batches`).
  """
  stable_ids = False

  def __init__(self, source: Sequence[str], tokenizer: Tokenizer, vocab: Vocab, max_token_chars: int,
               max_characters_per_token: int = MAX_CHARS, token_ids=None):
    self._source = source
    self._tokenizer = tokenizer
    self._vocab = vocab
    self._limit = max_token_chars  # a token's chars and softmax id are those of its first `_limit` chars
    self._width = max_characters_per_token
    # An EFML-style model's ids (`lexicon.TokenIds`: word id, then char-lexicon ids) instead of bilm-tf's bytes
    self._ids_of = token_ids or (lambda token: token_to_ids(token, self._width))
    # what the model's char ids cut: UTF-8 bytes for bilm-tf's ids, code points for a lexicon's
    lexicon_ids = token_ids.lexicon.ids() if token_ids is not None else None
    if lexicon_ids:
      self._is_cut = lambda token: len(token) > self._limit or lexicon_ids.is_cut(token)
    else:
      self._is_cut = lambda token: is_cut(token, self._width, self._limit)
    if token_ids is not None:
      self._width = token_ids.width
    self._index: dict[str, int] = {}  # token -> type id (<S> and </S> have none: a literal "<S>" is a word)
    self._n = 0
    self._chars = np.zeros([1024, self._width], np.int32)
    self._targets = np.zeros([1024], np.int32)
    self._truncated = np.zeros([1024], bool)
    if token_ids is not None:
      bos, eos = token_ids.bos, token_ids.eos
    else:
      bos, eos = token_to_ids(BOS_TOKEN, self._width), token_to_ids(EOS_TOKEN, self._width)
    self._append(bos, vocab.bos, False)
    self._append(eos, vocab.eos, False)

  @property
  def skipped(self) -> dict[str, int]:
    return dict(getattr(self._source, "skipped", {}))

  def __len__(self) -> int:
    return len(self._source)

  def _append(self, chars: np.ndarray, target: int, truncated: bool) -> int:
    if self._n == len(self._targets):  # doubling: amortized O(1) per new type
      self._chars = np.concatenate([self._chars, np.zeros_like(self._chars)])
      self._targets = np.concatenate([self._targets, np.zeros_like(self._targets)])
      self._truncated = np.concatenate([self._truncated, np.zeros_like(self._truncated)])
    i = self._n
    self._chars[i] = chars
    self._targets[i] = target
    self._truncated[i] = truncated
    self._n += 1
    return i

  def type_ids(self, index: int) -> np.ndarray:
    tokens = self._tokenizer(self._source[index])
    ids = np.empty([len(tokens)], np.int32)
    for k, token in enumerate(tokens):
      i = self._index.get(token)
      if i is None:  # e.g. URLs or tables glued into one token are cut; they would only be <UNK> anyway
        cut = token[:self._limit]
        i = self._index[token] = self._append(self._ids_of(cut), self._vocab.id(cut), self._is_cut(token))
      ids[k] = i
    return ids

  def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = self._n
    return self._chars[:n], self._targets[:n], self._truncated[:n]


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
    dedupe_shards: int | None = None,
    dedupe_by: str = "type",
    token_ids=None,
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
    dedupe_shards, dedupe_by: batches deduplicated for this many devices (`batches.LMIterator`; raw text's
      tables always go by content).
    token_ids: an EFML-style model's `lexicon.TokenIds` (ids [1 + max_chars] through its lexicons); None:
      bilm-tf's byte ids.

  Returns:
    A `batches.LMIterator` yielding `{"fwd_chars": int32 [b, U, 50], "fwd_targets": int32 [b, U],
    "bwd_chars": int32 [b, U, 50], "bwd_targets": int32 [b, U], "weights": float32 [b, U]}`; padded steps
    have all-0 chars, target 0 and weight 0.
  """
  if max_token_chars < 1:
    raise ValueError(f"max_token_chars={max_token_chars} must be >= 1")
  order, stride, first_row, config = stream_order(
      grain.MapDataset.range(len(source)), batch_size=batch_size, unroll_steps=unroll_steps, seed=seed,
      shuffle=shuffle, num_epochs=num_epochs, process_index=process_index, process_count=process_count,
      shard=shard, vocab=vocab, pretokenized=getattr(tokenizer, "pretokenized", None),
      max_token_chars=max_token_chars, max_characters_per_token=max_characters_per_token)
  types = TextTypes(source, tokenizer, vocab, max_token_chars, max_characters_per_token, token_ids)
  return LMIterator(types, order, config, batch_size, unroll_steps, stride, first_row, dedupe_shards, dedupe_by)
