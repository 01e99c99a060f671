"""Raw text -> tokens, the way the 1B Word Benchmark (ELMo's corpus) was tokenized: Moses, English rules."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
  from sacremoses import MosesTokenizer


class Tokenizer:
  """Callable `str -> list[str]`.

  With `pretokenized=True` the text is already tokenized (e.g. lm1b, bilm-tf training files) and is only
  split on whitespace, so tokens pass through unchanged. Otherwise sacremoses' `MosesTokenizer(lang="en")`
  runs with `escape=False`: XML escaping (`&amp;`) would put entities into the vocabulary that no raw
  input at inference time contains.
  """

  def __init__(self, pretokenized: bool = False, lang: str = "en"):
    self.pretokenized = pretokenized
    self.lang = lang
    # MosesTokenizer keeps no per-call state, but one instance per thread is cheap and avoids relying on it.
    self._local = threading.local()

  def _moses(self) -> "MosesTokenizer":
    moses = getattr(self._local, "moses", None)
    if moses is None:
      # imported on first use: compiling its rules costs a pretokenized run (and every command start) 0.3 s
      from sacremoses import MosesTokenizer  # pylint: disable=g-import-not-at-top
      moses = self._local.moses = MosesTokenizer(lang=self.lang)
    return moses

  def __call__(self, text: str) -> list[str]:
    if self.pretokenized:
      return text.split()
    return self._moses().tokenize(text, escape=False)

  def __getstate__(self) -> dict:
    # Grain may pickle transforms into worker processes; thread-locals are not picklable.
    return {"pretokenized": self.pretokenized, "lang": self.lang}

  def __setstate__(self, state: dict) -> None:
    self.__init__(**state)

  def __repr__(self) -> str:
    return f"Tokenizer(pretokenized={self.pretokenized}, lang={self.lang!r})"
