"""Word vocabulary in bilm-tf's format: `vocab.txt`, one token per line, line number = id."""
from __future__ import annotations

import collections
import hashlib
import os
from typing import Iterable, Sequence

import numpy as np

from elmo_jax.runtime import files
from elmo_jax.data.chars import BOS_TOKEN, EOS_TOKEN, UNK_TOKEN
from elmo_jax.runtime.run_layout import VOCAB_COUNTS_FILE as COUNTS_FILE, VOCAB_FILE

_SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)




class Vocab:
  """Token <-> id mapping plus (optionally) the training counts behind it.

  Attributes:
    tokens: id -> token.
    counts: id -> count in the corpus it was built from, or None (a bilm-tf file without counts).
      `<S>` counts 0 (never predicted), `</S>` the number of sentences, `<UNK>` all out-of-vocab tokens.
    bos, eos, unk: ids of `<S>`, `</S>`, `<UNK>`.
  """

  def __init__(
      self,
      tokens: Sequence[str],
      counts: Sequence[int] | None = None,
      source: str = "<memory>",
      require_specials: bool = True,
  ):
    self.tokens = list(tokens)
    self.source = source  # the file it was read from (messages name it)
    self.counts = None if counts is None else np.asarray(counts, dtype=np.int64)
    self._ids = {}
    for i, token in enumerate(self.tokens):
      if token in self._ids:
        raise ValueError(f"{source}: token {token!r} appears twice (line {self._ids[token] + 1} and {i + 1})")
      self._ids[token] = i
    missing = [s for s in _SPECIALS if s not in self._ids]
    if missing and require_specials:
      raise ValueError(f"{source}: vocabulary lacks required special token(s) {missing}; add them as lines")
    if self.counts is not None and len(self.counts) != len(self.tokens):
      raise ValueError(f"{source}: {len(self.counts)} counts for {len(self.tokens)} tokens")
    # -1 like bilm-tf's Vocabulary(validate_file=False): fine for inference, never for training targets.
    self.bos, self.eos, self.unk = (self._ids.get(s, -1) for s in _SPECIALS)

  @classmethod
  def build(cls, sentences: Iterable[Sequence[str]], max_size: int | None = None, min_count: int = 1) -> "Vocab":
    """Counts tokens of tokenized sentences; ids 0,1,2 = `<S>`,`</S>`,`<UNK>`, then by count desc, token asc.

    Args:
      sentences: iterable of token lists (one per sentence; the sentence count becomes `</S>`'s count).
      max_size: total vocabulary size including the three special tokens; None = no limit.
      min_count: tokens seen fewer times map to `<UNK>`.
    """
    if max_size is not None and max_size < len(_SPECIALS):
      raise ValueError(f"max_size={max_size} must be >= {len(_SPECIALS)} (room for <S>, </S>, <UNK>)")
    counter: collections.Counter[str] = collections.Counter()
    n_sentences = 0
    for sentence in sentences:
      counter.update(sentence)
      n_sentences += 1
    for special in _SPECIALS:  # specials in the text would otherwise get a second id
      counter.pop(special, None)
    ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
    ranked = [kv for kv in ranked if kv[1] >= min_count]
    if max_size is not None:
      ranked = ranked[: max_size - len(_SPECIALS)]
    n_unk = sum(counter.values()) - sum(c for _, c in ranked)
    tokens = list(_SPECIALS) + [t for t, _ in ranked]
    counts = [0, n_sentences, n_unk] + [c for _, c in ranked]
    return cls(tokens, counts)

  @classmethod
  def load(cls, path: str, require_specials: bool = True) -> "Vocab":
    """Reads a `vocab.txt` (or a directory holding one); counts come from a sibling `vocab_counts.tsv`.

    `<S>`, `</S>`, `<UNK>` may sit on any line (bilm-tf files) but must all be present unless
    `require_specials=False` (bilm-tf's own `vocab_test.txt` has no `<UNK>`; missing ids become -1).
    bilm-tf's `!!!MAXTERMID` marker line is dropped as bilm-tf does.
    """
    if os.path.isdir(path):
      path = os.path.join(path, VOCAB_FILE)
    if not os.path.exists(path):
      raise FileNotFoundError(f"vocab file {path} does not exist; build one with Vocab.build(...).save(workdir)")
    with open(path, encoding="utf-8") as f:
      # bilm-tf's Vocabulary strips each line too.
      tokens = [t for t in (line.strip() for line in f) if t != "!!!MAXTERMID"]
    if tokens and tokens[0].startswith("\ufeff"):  # bilm-tf would read the mark as part of the first token
      raise ValueError(f"{path}:1: starts with a UTF-8 byte order mark (an editor's); save it without one "
                       "(e.g. `sed -i '1s/^\\xEF\\xBB\\xBF//' FILE`)")
    while tokens and not tokens[-1]:  # a trailing blank line is an editor artefact, not a token
      tokens.pop()
    for i, token in enumerate(tokens):
      if not token:
        raise ValueError(f"{path}:{i + 1}: empty line inside the vocabulary; remove it")
    counts = None
    counts_path = os.path.join(os.path.dirname(path), COUNTS_FILE)
    if os.path.exists(counts_path):
      counts = cls._read_counts(counts_path, tokens)
    return cls(tokens, counts, source=path, require_specials=require_specials)

  @staticmethod
  def _read_counts(counts_path: str, tokens: list[str]) -> list[int] | None:
    by_token = {}
    with open(counts_path, encoding="utf-8") as f:
      for i, line in enumerate(f):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 2 or not parts[1].isdigit():
          raise ValueError(f"{counts_path}:{i + 1}: expected 'token<TAB>count', got {line.rstrip()!r}")
        by_token[parts[0]] = int(parts[1])
    if set(by_token) != set(tokens):
      # A stale counts file next to a replaced vocab.txt; counts would silently be wrong.
      raise ValueError(f"{counts_path}: tokens differ from the vocab.txt next to it; delete or regenerate it")
    return [by_token[t] for t in tokens]

  def save(self, workdir: str) -> str:
    """Writes `workdir/vocab.txt` (+ `vocab_counts.tsv` when counts are known) atomically; returns the path."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, VOCAB_FILE)
    files.write_text(path, "".join(t + "\n" for t in self.tokens))
    if self.counts is not None:
      files.write_text(
          os.path.join(workdir, COUNTS_FILE),
          "".join(f"{t}\t{c}\n" for t, c in zip(self.tokens, self.counts.tolist())),
      )
    return path

  def __len__(self) -> int:
    return len(self.tokens)

  def __contains__(self, token: str) -> bool:
    return token in self._ids

  def id(self, token: str) -> int:
    return int(self.encode([token])[0])

  def encode(self, tokens: Sequence[str]) -> np.ndarray:
    """Tokens -> `[len(tokens)]` int32 ids, unknown tokens -> `<UNK>`."""
    get, unk = self._ids.get, self.unk
    if unk < 0:
      missing = [t for t in tokens if t not in self._ids]
      if missing:
        raise KeyError(f"token {missing[0]!r} not in a vocabulary without <UNK>; load one that has <UNK>")
    return np.fromiter((get(t, unk) for t in tokens), dtype=np.int32, count=len(tokens))

  def decode(self, ids: Iterable[int]) -> list[str]:
    return [self.tokens[i] for i in ids]

  def sha256(self) -> str:
    """Hash of the token list (order matters: it fixes the softmax rows); counts are not part of it."""
    return hashlib.sha256("\n".join(self.tokens).encode("utf-8")).hexdigest()

  def unigram_log_probs(self) -> np.ndarray:
    """`[len(vocab)]` float64 natural-log unigram probabilities from the counts (`<S>` gets -inf)."""
    if self.counts is None:
      raise ValueError("vocab has no counts; build it with Vocab.build or put vocab_counts.tsv next to vocab.txt")
    total = self.counts.sum()
    if total <= 0:
      raise ValueError("vocab counts sum to 0; cannot form unigram probabilities")
    with np.errstate(divide="ignore"):
      return np.log(self.counts / total)
