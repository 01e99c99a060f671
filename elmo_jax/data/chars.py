"""Character ids exactly as bilm-tf's `UnicodeCharsVocabulary` + `Batcher` produce them (and, `LexiconIds`, as
ELMoForManyLangs' code does from its models' char.dic and word.dic).

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


def is_cut(token: str, max_chars: int = MAX_CHARS, max_token_chars: int | None = None) -> bool:
  """Whether the model sees less than `token`: `token_to_ids` keeps `max_chars - 2` UTF-8 bytes, not characters
  (a Chinese character is 3 bytes: 17 of them are cut), after a cut to `max_token_chars` characters (the
  trainer's `data.max_token_chars`), if given."""
  if token in (BOS_TOKEN, EOS_TOKEN):
    return False
  if max_token_chars is not None and len(token) > max_token_chars:
    return True
  return len(token.encode("utf-8", "ignore")) > max_chars - 2


def tokens_to_ids(tokens: Sequence[str], max_chars: int = MAX_CHARS) -> np.ndarray:
  """Tokens -> `[len(tokens), max_chars]` int32, each row `token_to_ids(token)`, byte for byte; no Python
  loop per character: the tokens' UTF-8 bytes are joined once and scattered into place with numpy."""
  out = np.full((len(tokens), max_chars), PAD_CHAR + 1, np.int32)
  if not len(tokens):
    return out
  encoded = [t.encode("utf-8", "ignore")[:max_chars - 2] for t in tokens]
  lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
  rows = np.repeat(np.arange(len(encoded)), lengths)
  cols = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1
  out[rows, cols] = np.frombuffer(b"".join(encoded), np.uint8).astype(np.int32) + 1
  out[:, 0] = BOW_CHAR + 1
  out[np.arange(len(encoded)), lengths + 1] = EOW_CHAR + 1
  for i, token in enumerate(tokens):  # the two sentence boundaries are not their bytes
    if token in (BOS_TOKEN, EOS_TOKEN):
      out[i] = _special(BOS_CHAR if token == BOS_TOKEN else EOS_CHAR, max_chars)
  return out


# ELMoForManyLangs (EFML): a token's ids come from its model's char.dic and word.dic, one id per Unicode code point.
EFML_BOS, EFML_EOS, EFML_OOV, EFML_PAD = "<bos>", "<eos>", "<oov>", "<pad>"


def read_dic(path: str) -> dict[str, int]:
  """An EFML `char.dic` / `word.dic` (`token<TAB>id` lines) exactly as its `Embedder.get_model` reads it: the
  line stripped, a line left with the id alone is U+3000 (an ideographic space: strip() removes it), a later
  line of the same token wins. ValueError naming the line for any other line (not UTF-8, an id that is not
  ASCII digits: `²` or a negative one)."""
  out: dict[str, int] = {}
  with open(path, "rb") as f:
    for n, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{n}: not UTF-8 (byte {e.start} is {raw[e.start:e.start + 1]!r}; Latin-1?)") from None
      parts = line.strip().split("\t")
      if len(parts) == 1:
        parts.insert(0, "\u3000")
      if len(parts) != 2 or not (parts[1].isascii() and parts[1].isdigit()):
        raise ValueError(f"{path}:{n}: expected 'token<TAB>id' with a non-negative id, got {line.rstrip()[:60]!r}")
      out[parts[0]] = int(parts[1])
  return out


class LexiconIds:
  """Token -> ids of an EFML model, as its `read_list` + `create_one_batch` make them (shifted by +1, 0 = no
  token): `[1 + max_chars]` with a word vocabulary (the word id first: `word2id` or `<oov>`), else `[max_chars]`.

  A token is cut to `max_chars - 2` code points (not UTF-8 bytes); its char ids are the begin-of-word id, one
  per code point (`<oov>` for a char outside char.dic), the end-of-word id, then `<pad>`. The begin and end ids
  are those EFML's code assigns: it reads `bow_id, eow_id` from `('<eow>', '<bow>')`, so a word begins with
  `<eow>`'s id and ends with `<bow>`'s, as its models were trained. `<bos>` / `<eos>` (the sentence boundaries,
  `special`) hold their own char id between the two.
  """

  def __init__(self, char2id: dict[str, int], word2id: dict[str, int] | None, max_chars: int = MAX_CHARS):
    for name, vocab in (("char", char2id), ("word", word2id)):
      for key in (EFML_OOV, EFML_PAD) + ((EFML_BOS, EFML_EOS, "<bow>", "<eow>") if name == "char" else ()):
        if vocab is not None and key not in vocab:
          raise ValueError(f"{name}.dic has no {key}")
    self.char2id = char2id
    self.word2id = word2id
    self.max_chars = max_chars
    self.lead = 0 if word2id is None else 1  # ids before the char ids
    self.pad_id = char2id[EFML_PAD] + 1
    self._begin = char2id["<eow>"] + 1  # sic: a word begins with <eow>'s id, ends with <bow>'s (docstring)
    self._end = char2id["<bow>"] + 1
    self._oov = char2id[EFML_OOV] + 1

  def is_cut(self, token: str) -> bool:
    """Whether `__call__` cuts `token` (its code points past `max_chars - 2`)."""
    return len(token) + 2 > self.max_chars

  def __call__(self, token: str) -> np.ndarray:
    if len(token) + 2 > self.max_chars:
      token = token[:self.max_chars - 2]
    ids = np.full([self.lead + self.max_chars], self.pad_id, np.int32)
    if self.lead:
      ids[0] = self.word2id.get(token, self.word2id[EFML_OOV]) + 1
    if token in (EFML_BOS, EFML_EOS):
      codes = [self.char2id[token] + 1]
    else:
      codes = [self.char2id.get(c, self._oov - 1) + 1 for c in token]
    ids[self.lead] = self._begin
    ids[self.lead + 1:self.lead + 1 + len(codes)] = codes
    ids[self.lead + 1 + len(codes)] = self._end
    return ids

  @property
  def special(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids of the sentence boundaries `<bos>` and `<eos>` (`BiLMConfig.special_ids`)."""
    return tuple(int(i) for i in self(EFML_BOS)), tuple(int(i) for i in self(EFML_EOS))


# What a CharIdCache may hold, in bytes of ids: its rows are `max_chars` wide, which a model's options set
# (`formats/options.LIMITS`): the count of rows alone would not bound it.
MAX_CACHE_BYTES = 256 * 2**20


class CharIdCache:
  """Memoises `token_to_ids` (or `ids_of`, e.g. a `LexiconIds`): corpora repeat tokens, and the UTF-8 work
  dominates otherwise. Holds at most `max_size` tokens and `max_bytes` of ids (whichever is fewer rows)."""

  def __init__(self, max_chars: int = MAX_CHARS, max_size: int = 1_000_000, ids_of=None,
               max_bytes: int = MAX_CACHE_BYTES):
    self.max_chars = max_chars
    # +1: an EFML token's word id before its char ids; 4 bytes an int32 id
    self.max_size = min(max_size, max_bytes // (4 * (max_chars + 1)))
    self._bytes = ids_of is None  # bilm-tf's byte ids: `many` builds them vectorised
    self.ids_of = ids_of or (lambda token: token_to_ids(token, max_chars))
    self._cache: dict[str, np.ndarray] = {}

  def many(self, tokens: Sequence[str], keep: bool = True) -> np.ndarray:
    """`[len(tokens), width]`: row i is `self(tokens[i])`; bilm-tf's ids of the tokens not cached yet are
    built at once (`tokens_to_ids`), an `ids_of`'s one token at a time; `keep=False`: not cached (a
    vocabulary met once)."""
    missing = [t for t in dict.fromkeys(tokens) if t not in self._cache]
    made = dict(zip(missing, tokens_to_ids(missing, self.max_chars) if self._bytes else map(self.ids_of, missing)))
    for token, ids in made.items() if keep else ():
      if len(self._cache) >= self.max_size:
        break
      self._cache[token] = ids
    if not len(tokens):
      return np.zeros((0, self.max_chars if self._bytes else len(self.ids_of(BOS_TOKEN))), np.int32)
    get = self._cache.get
    return np.stack([made[t] if t in made else get(t) for t in tokens])

  def __call__(self, token: str) -> np.ndarray:
    ids = self._cache.get(token)
    if ids is None:
      ids = self.ids_of(token)
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
  sentences = [([BOS_TOKEN, *s, EOS_TOKEN] if add_bos_eos else list(s)) for s in batch]
  index: dict[str, int] = {}
  flat = [index.setdefault(t, len(index)) for s in sentences for t in s]
  if flat:  # each distinct token's ids once (`CharIdCache.many`), then one scatter into the batch
    lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
    rows = np.repeat(np.arange(len(sentences)), lengths)
    out[rows, np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = \
        cache.many(list(index))[np.asarray(flat)]
  return out
