"""The char and word lexicons of an ELMoForManyLangs-style (EFML) model: read from a release's char.dic /
word.dic, or built from training text as EFML's own trainer builds them (`elmoformanylangs/biLM.py`), and the
token ids a run's data path gives every token through them (`TokenIds`), unknown chars and words counted.

    lex = lexicon.build(sentences, max_chars=50, min_count=3)   # sentences: lists of tokens
    lex.save("run/lexicon")                                     # char.dic, word.dic (token<TAB>id by id)
    ids = lexicon.TokenIds(lex)                                 # ids(token) -> int32 [1 + max_chars]

Built as EFML builds them: the word lexicon is `<oov>` 0, `<bos>` 1, `<eos>` 2, `<pad>` 3, then the words of
count >= `min_count` by count (ties in order of first occurrence), at most `max_size` entries in all; the char
lexicon is every code point in order of first occurrence in `<bos> w1 .. wn <eos>` (EFML's trainer walks the
boundary tokens' characters too), then `<bos>`, `<eos>`, `<oov>`, `<pad>`, `<bow>`, `<eow>`. Tokens are cut to
`max_chars - 2` code points first, as EFML's `read_corpus` does.
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Iterable, Sequence

import numpy as np

from elmo_jax.data import chars
from elmo_jax.runtime import files

CHAR_DIC, WORD_DIC = "char.dic", "word.dic"
WORD_SPECIALS = (chars.EFML_OOV, chars.EFML_BOS, chars.EFML_EOS, chars.EFML_PAD)
CHAR_SPECIALS = (chars.EFML_BOS, chars.EFML_EOS, chars.EFML_OOV, chars.EFML_PAD, "<bow>", "<eow>")


class LexiconError(ValueError):
  """A lexicon folder that cannot be read; one line naming the file."""


@dataclasses.dataclass(frozen=True)
class Lexicon:
  """char2id (and word2id, None for a chars-only model) with the model's `max_characters_per_token`."""
  char2id: dict[str, int]
  word2id: dict[str, int] | None
  max_chars: int

  def ids(self) -> chars.LexiconIds:
    return chars.LexiconIds(self.char2id, self.word2id, self.max_chars)

  def option_values(self) -> dict[str, object]:
    """The `options.char_cnn` values this lexicon fixes: char_vocab_size, word_embedding.n_words, special_ids."""
    return {"char_vocab_size": len(self.char2id), "n_words": len(self.word2id or ()),
            "special_ids": [list(row) for row in self.ids().special]}

  def save(self, folder: str) -> None:
    """char.dic (and word.dic) into `folder`, each written whole (temp file, then rename)."""
    os.makedirs(folder, exist_ok=True)
    files.write_text(os.path.join(folder, CHAR_DIC), dic_text(self.char2id))
    if self.word2id is not None:
      files.write_text(os.path.join(folder, WORD_DIC), dic_text(self.word2id))


def dic_text(vocab: dict[str, int]) -> str:
  """A char.dic / word.dic as EFML writes it: `token<TAB>id` lines by id."""
  return "".join(f"{token}\t{i}\n" for token, i in sorted(vocab.items(), key=lambda kv: kv[1]))


def read(folder: str, max_chars: int, words: bool = True) -> Lexicon:
  """char.dic (and word.dic where `words`) of `folder`; LexiconError, one line naming the file."""
  out = []
  for name in (CHAR_DIC, WORD_DIC) if words else (CHAR_DIC,):
    path = os.path.join(folder, name)
    try:
      out.append(chars.read_dic(path))
    except FileNotFoundError:
      raise LexiconError(f"{path}: not found (an EFML-style model needs {CHAR_DIC} and {WORD_DIC})") from None
    except (ValueError, UnicodeDecodeError) as e:
      raise LexiconError(str(e) if isinstance(e, ValueError) else f"{path}: not UTF-8 text") from None
  lexicon = Lexicon(out[0], out[1] if words else None, max_chars)
  try:
    lexicon.ids()
  except ValueError as e:
    raise LexiconError(f"{folder}/{e}") from None
  return lexicon


def build(sentences: Iterable[Sequence[str]], max_chars: int, min_count: int = 1,
          max_size: int | None = None, words: bool = True) -> Lexicon:
  """The lexicons EFML's trainer builds from `sentences` (lists of tokens); see the module docstring."""
  cut = max_chars - 2
  char2id: dict[str, int] = {}
  counts: collections.Counter = collections.Counter()
  for sentence in sentences:
    tokens = [t[:cut] for t in sentence]
    counts.update(tokens)
    for token in (chars.EFML_BOS, *tokens, chars.EFML_EOS):
      for c in token:
        if c not in char2id:
          char2id[c] = len(char2id)
  for special in CHAR_SPECIALS:
    char2id.setdefault(special, len(char2id))
  if not words:
    return Lexicon(char2id, None, max_chars)
  word2id = {w: i for i, w in enumerate(WORD_SPECIALS)}
  for word, n in sorted(counts.items(), key=lambda kv: -kv[1]):  # stable: ties keep first occurrence
    if n < min_count or (max_size is not None and len(word2id) >= max_size):
      break
    word2id.setdefault(word, len(word2id))
  return Lexicon(char2id, word2id, max_chars)


class TokenIds:
  """A run's token -> ids through a `Lexicon` (`chars.LexiconIds`), with the sentence boundaries' ids and the
  unknowns counted per token type: `unknown_words` (no word.dic entry: `<oov>`'s row), `unknown_char_types`
  (a char outside char.dic: `<oov>`'s char row)."""

  def __init__(self, lexicon: Lexicon):
    self.lexicon, self._ids = lexicon, lexicon.ids()
    self.width = self._ids.lead + lexicon.max_chars
    self.bos, self.eos = (np.asarray(row, np.int32) for row in self._ids.special)
    self.unknown_words = self.unknown_char_types = 0

  def __call__(self, token: str) -> np.ndarray:
    cut = token[:self.lexicon.max_chars - 2]
    if self.lexicon.word2id is not None and cut not in self.lexicon.word2id:
      self.unknown_words += 1
    if any(c not in self.lexicon.char2id for c in cut):
      self.unknown_char_types += 1
    return self._ids(token)

  def is_unknown(self, token: str) -> tuple[bool, bool]:
    """(no word.dic entry, a char outside char.dic) for `token` as the data path cuts it."""
    cut = token[:self.lexicon.max_chars - 2]
    return (self.lexicon.word2id is not None and cut not in self.lexicon.word2id,
            any(c not in self.lexicon.char2id for c in cut))
