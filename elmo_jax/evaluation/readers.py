"""Readers for the probing datasets; every format error names the file and line.

Formats (UTF-8, no header):
  * WSD TSV: `lemma<TAB>pos<TAB>sense<TAB>token_index<TAB>sentence`, sentence
    whitespace-tokenized, token_index 0-based.
  * CoNLL-like tagging: `word<TAB>TAG` per line, a blank line between sentences.
  * Labelled sentences TSV: `label<TAB>sentence` (raw text, tokenized here).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Iterator, Sequence


class InputError(ValueError):
  """Bad input data; the message is one line naming the file (and line)."""


@dataclasses.dataclass(frozen=True)
class WsdExample:
  lemma: str
  pos: str
  sense: str
  token_index: int
  tokens: tuple[str, ...]
  line: int


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
  tokens: tuple[str, ...]
  tags: tuple[str, ...]
  line: int  # line of the first token


@dataclasses.dataclass(frozen=True)
class LabelledSentence:
  label: str
  tokens: tuple[str, ...]
  line: int


# Splits punctuation and English clitics off words, like the tokenizer that
# produced the WSD/POS files, so raw sentiment text looks like the LM's input.
_TOKEN_RE = re.compile(
    r"[A-Za-z]+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+(?:[-./]\w+)*|[^\w\s]",
    re.UNICODE)


def tokenize(text: str) -> list[str]:
  """Simple rule tokenizer for raw sentences (punctuation and clitics split)."""
  return _TOKEN_RE.findall(text)


def file_digest(path: str) -> str:
  """sha256 hex digest of a file's bytes (keys the feature cache)."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _lines(path: str) -> Iterator[tuple[int, str]]:
  """Yields (1-based line number, line without the newline)."""
  if not path:
    raise InputError("no input file given")
  if not os.path.isfile(path):
    raise InputError(f"{path}: file not found")
  try:
    with open(path, encoding="utf-8") as f:
      for number, line in enumerate(f, start=1):
        yield number, line.rstrip("\r\n")
  except UnicodeDecodeError as e:
    raise InputError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None


def _columns(path: str, number: int, line: str, n: int, fmt: str) -> list[str]:
  cols = line.split("\t")
  if len(cols) != n:
    raise InputError(f"{path}:{number}: expected {n} tab-separated columns "
                     f"({fmt}), got {len(cols)}")
  return cols


def read_wsd(path: str) -> list[WsdExample]:
  """Reads a WSD TSV file; checks that token_index points at the lemma."""
  fmt = "lemma, pos, sense, token_index, sentence"
  out = []
  for number, line in _lines(path):
    if not line.strip():
      continue
    lemma, pos, sense, index, sentence = _columns(path, number, line, 5, fmt)
    tokens = tuple(sentence.split())
    try:
      i = int(index)
    except ValueError:
      raise InputError(f"{path}:{number}: token_index {index!r} is not an integer") from None
    if not 0 <= i < len(tokens):
      raise InputError(f"{path}:{number}: token_index {i} outside the sentence "
                       f"of {len(tokens)} tokens")
    if not lemma or not sense:
      raise InputError(f"{path}:{number}: empty lemma or sense")
    out.append(WsdExample(lemma, pos, sense, i, tokens, number))
  if not out:
    raise InputError(f"{path}: no examples")
  return out


def read_conll(path: str) -> list[TaggedSentence]:
  """Reads `word<TAB>TAG` lines with blank lines between sentences."""
  out, tokens, tags, first = [], [], [], 0
  for number, line in _lines(path):
    if not line.strip():
      if tokens:
        out.append(TaggedSentence(tuple(tokens), tuple(tags), first))
      tokens, tags = [], []
      continue
    word, tag = _columns(path, number, line, 2, "word, TAG")
    if not word or not tag:
      raise InputError(f"{path}:{number}: empty word or tag")
    if not tokens:
      first = number
    tokens.append(word)
    tags.append(tag)
  if tokens:
    out.append(TaggedSentence(tuple(tokens), tuple(tags), first))
  if not out:
    raise InputError(f"{path}: no sentences")
  return out


def read_labelled(path: str) -> list[LabelledSentence]:
  """Reads `label<TAB>sentence` lines; the sentence is tokenized."""
  out = []
  for number, line in _lines(path):
    if not line.strip():
      continue
    label, sentence = _columns(path, number, line, 2, "label, sentence")
    tokens = tuple(tokenize(sentence))
    if not label.strip():
      raise InputError(f"{path}:{number}: empty label")
    if not tokens:
      raise InputError(f"{path}:{number}: empty sentence")
    out.append(LabelledSentence(label.strip(), tokens, number))
  if not out:
    raise InputError(f"{path}: no examples")
  return out


def check_labels(path: str, labels: Sequence[tuple[str, int]],
                 known: Sequence[str]) -> None:
  """Fails on the first (label, line) whose label is not in `known` (the train set)."""
  known_set = set(known)
  for label, number in labels:
    if label not in known_set:
      shown = sorted(known_set)
      more = "" if len(shown) <= 12 else f" ... ({len(shown)} labels)"
      raise InputError(f"{path}:{number}: unknown label {label!r}; the training "
                       f"label set is {shown[:12]}{more}")
