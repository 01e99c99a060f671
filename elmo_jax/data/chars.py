"""Character ids exactly as bilm-tf's `UnicodeCharsVocabulary` + `Batcher` produce them.

Every token becomes `max_characters_per_token` (50) ids: begin-of-word, up to 48 UTF-8 bytes (a multi-byte
character may be cut), end-of-word, then padding. All ids are shifted by +1 so that 0 means "no token"
(a padded time step); the char embedding table therefore has 262 rows with row 0 fixed to zero.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

MAX_CHARS = 50
# Raw (unshifted) special ids, as in bilm-tf data.py.
BOS_CHAR = 256  # begin of sentence
EOS_CHAR = 257  # end of sentence
BOW_CHAR = 258  # begin of word
EOW_CHAR = 259  # end of word
PAD_CHAR = 260  # padding inside a token
N_CHARS = 262  # 261 raw ids + the shifted-in "no token" id 0

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"
UNK_TOKEN = "<UNK>"


def _special(c: int, max_chars: int) -> np.ndarray:
  ids = np.full([max_chars], PAD_CHAR, dtype=np.int32)
  ids[0], ids[1], ids[2] = BOW_CHAR, c, EOW_CHAR
  return ids + 1


def token_to_ids(token: str, max_chars: int = MAX_CHARS) -> np.ndarray:
  """One token -> [max_chars] int32 char ids (already shifted by +1)."""
  if token == BOS_TOKEN:
    return _special(BOS_CHAR, max_chars)
  if token == EOS_TOKEN:
    return _special(EOS_CHAR, max_chars)
  ids = np.full([max_chars], PAD_CHAR, dtype=np.int32)
  encoded = token.encode("utf-8", "ignore")[: max_chars - 2]
  ids[0] = BOW_CHAR
  ids[1 : len(encoded) + 1] = np.frombuffer(encoded, dtype=np.uint8)
  ids[len(encoded) + 1] = EOW_CHAR
  return ids + 1


class CharIdCache:
  """Memoises `token_to_ids`: corpora repeat tokens, and the UTF-8 work dominates otherwise."""

  def __init__(self, max_chars: int = MAX_CHARS, max_size: int = 1_000_000):
    self.max_chars = max_chars
    self.max_size = max_size
    self._cache: dict[str, np.ndarray] = {}

  def __call__(self, token: str) -> np.ndarray:
    ids = self._cache.get(token)
    if ids is None:
      ids = token_to_ids(token, self.max_chars)
      if len(self._cache) < self.max_size:
        self._cache[token] = ids
    return ids


_DEFAULT_CACHE = CharIdCache()


def batch_to_ids(
    batch: Sequence[Sequence[str]],
    add_bos_eos: bool = False,
    max_chars: int = MAX_CHARS,
    pad_to: int | None = None,
) -> np.ndarray:
  """Sentences -> char ids `[batch, max_len, max_chars]` int32; padded slots are all 0.

  With `add_bos_eos` each sentence is wrapped in `<S>` ... `</S>` (bilm-tf's Batcher does this; the
  `BiLM` module adds them itself, so the default is False). `pad_to` fixes the time dimension.
  """
  cache = _DEFAULT_CACHE if max_chars == MAX_CHARS else CharIdCache(max_chars)
  extra = 2 if add_bos_eos else 0
  max_len = max((len(s) for s in batch), default=0) + extra
  if pad_to is not None:
    if pad_to < max_len:
      raise ValueError(f"pad_to={pad_to} is shorter than the longest sentence ({max_len} tokens)")
    max_len = pad_to
  out = np.zeros([len(batch), max_len, max_chars], dtype=np.int32)
  for b, sentence in enumerate(batch):
    tokens = list(sentence)
    if add_bos_eos:
      tokens = [BOS_TOKEN] + tokens + [EOS_TOKEN]
    for t, token in enumerate(tokens):
      out[b, t] = cache(token)
  return out
