"""Readers for the probing datasets; every format error names the file and line.

Formats (UTF-8, no header):
  * WSD TSV: `lemma<TAB>pos<TAB>sense<TAB>token_index<TAB>sentence`, sentence
    whitespace-tokenized, token_index 0-based.
  * CoNLL-like tagging: `word<TAB>TAG` per line, a blank line between sentences. A file that cannot be
    one (a column holding spaces, no blank line for `MAX_SENTENCE_TOKENS` lines, ...) is refused naming
    the line and what it looks like (`conll_problem`).
  * Labelled sentences TSV: `label<TAB>sentence` (raw text, tokenized here).
  * Labelled sentences from TFDS: `tfds:NAME:SPLIT` (e.g. `tfds:glue/sst2:validation`),
    read with `tfds.data_source` (ArrayRecord, no TensorFlow) from a locally prepared
    copy; records with a text feature (`sentence` or `text`) and an integer `label`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import logging
import os
import re
from typing import Any, Iterator, Sequence

from elmo_jax.data.sources import local_tfds_dir
from elmo_jax.runtime import files
from elmo_jax.runtime import streams


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


TFDS_PREFIX = "tfds:"


def is_tfds(path: str | None) -> bool:
  return bool(path) and path.startswith(TFDS_PREFIX)


def parse_tfds(spec: str) -> tuple[str, str]:
  """`tfds:NAME[:VERSION]:SPLIT` -> (NAME[:VERSION], SPLIT); SPLIT may slice (`train[:10%]`)."""
  name, _, split = spec[len(TFDS_PREFIX):].partition(":")
  version, _, rest = split.partition(":")
  if rest and re.fullmatch(r"\d+(\.(\d+|\*))*", version):
    name, split = f"{name}:{version}", rest
  if not name or not split:
    raise InputError(f"{spec}: expected tfds:NAME:SPLIT, e.g. tfds:glue/sst2:validation")
  return name, split


@contextlib.contextmanager
def _quiet_absl():
  """Mutes TFDS's absl warnings (e.g. "Variant folder ... has no dataset_info.json"):
  bad input must end in one line on stderr."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def _tfds_unavailable(spec: str, name: str, data_dir: str | None, error: Exception) -> str:
  """One line on why `tfds.data_source` failed; a missing dataset gets the preparation hint."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  where = f"--tfds_data_dir={data_dir}" if data_dir else "the default TFDS data_dir"
  hint = (f"prepare it once with network access: python -c \"import tensorflow_datasets as tfds; "
          f"tfds.data_source('{name}'{f', data_dir={data_dir!r}' if data_dir else ''}, "
          f"download=True)\" or "
          f"`tfds build {name} --file_format=array_record"
          f"{f' --data_dir={data_dir}' if data_dir else ''}`")
  if isinstance(error, tfds.core.registered.DatasetNotFoundError):
    return f"{spec}: TFDS dataset {name!r} is not registered nor found under {where}; {hint}"
  try:  # Unprepared data fails with a misleading "file format TFRECORD" error: check first.
    prepared = tfds.builder(name, data_dir=data_dir).is_prepared()
  except Exception:  # pylint: disable=broad-except
    prepared = False
  if not prepared:
    return f"{spec}: TFDS dataset {name!r} is not prepared under {where}; {hint}"
  first = (str(error).strip().splitlines() or [type(error).__name__])[0]
  return f"{spec}: cannot read TFDS split under {where}: {first}"


def _tfds_text(value: Any, spec: str, index: int) -> str:
  if isinstance(value, str):
    return value
  try:
    return bytes(value).decode("utf-8")
  except (TypeError, ValueError):
    raise InputError(f"{spec}: record {index}: text is not UTF-8 bytes/str") from None


def read_tfds_labelled(spec: str, data_dir: str | None = None, text_key: str | None = None,
                       label_key: str | None = None) -> list[LabelledSentence]:
  """Reads `tfds:NAME:SPLIT` like `read_labelled`; `line` is the 0-based record index.

  The text is `text_key`, else `sentence` (glue/sst2), else `text` (imdb_reviews); the
  label is the integer `label_key` (default `label`), as a string ("0", "1", ...) like
  the TSV labels. A label < 0 (glue/sst2's test split) is refused: it is unlabelled.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow, only when used)
  except ImportError:
    raise InputError(f"{spec}: tensorflow_datasets is not installed") from None
  name, split = parse_tfds(spec)
  with _quiet_absl():
    try:
      data_dir = local_tfds_dir(data_dir, name)
      source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except  (tfds raises a zoo of types)
      raise InputError(_tfds_unavailable(spec, name, data_dir, e)) from None
  records = source.__getitems__(range(len(source))) if len(source) else []
  if not records:
    raise InputError(f"{spec}: no examples")
  keys = sorted(records[0])
  text_key = text_key or next((k for k in ("sentence", "text") if k in keys), "sentence")
  label_key = label_key or "label"
  for key, flag in ((text_key, "--tfds_text_key"), (label_key, "--tfds_label_key")):
    if key not in keys:
      raise InputError(f"{spec}: records have no feature {key!r} (features: {keys}); "
                       f"choose one with {flag}")
  out = []
  for index, record in enumerate(records):
    try:
      label = int(record[label_key])
    except (TypeError, ValueError):
      raise InputError(f"{spec}: record {index}: label {record[label_key]!r} is not an "
                       "integer") from None
    if label < 0:
      raise InputError(f"{spec}: record {index} has label {label}: an unlabelled split "
                       "(glue/sst2's test labels are hidden); use a labelled split, "
                       "e.g. validation, as the test set")
    tokens = tuple(tokenize(_tfds_text(record[text_key], spec, index)))
    if not tokens:
      raise InputError(f"{spec}: record {index}: empty sentence")
    out.append(LabelledSentence(str(label), tokens, index))
  return out


def labelled_digest(rows: Sequence[LabelledSentence]) -> str:
  """sha256 of labels and tokens (keys the feature cache of data that is not a file)."""
  digest = hashlib.sha256()
  for row in rows:
    digest.update(("\t".join((row.label,) + row.tokens) + "\n").encode())
  return digest.hexdigest()


def _lines(path: str) -> Iterator[tuple[int, str]]:
  """Yields (1-based line number, line without the newline); a file that is no text (HDF5, binary) is
  refused first (`files.text_problem`)."""
  if not path:
    raise InputError("no input file given")
  if not os.path.isfile(path) and not files.is_stream(path):
    raise InputError(f"{path}: file not found")
  problem = None if files.is_stream(path) else files.text_problem(path)  # a pipe is read once, below
  if problem is not None:
    raise InputError(f"{path}: {problem}")
  try:  # a stream (a pipe, a FIFO, a device) checked from its first block: /dev/zero is one line, not a hang
    with (streams.open_stream(path) if files.is_stream(path) else open(path, "rb")) as raw:
      for number, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8"), start=1):
        yield number, line.rstrip("\r\n")
  except UnicodeDecodeError as e:
    raise InputError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
  except streams.StreamError as e:
    raise InputError(str(e)) from None


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


# A CoNLL sentence longer than this is a file without sentence breaks (the Penn Treebank's longest has
# ~250 tokens): e.g. a one-record-per-line TSV given as a CoNLL file.
MAX_SENTENCE_TOKENS = 1000
_CONLL = "CoNLL word<TAB>TAG: one token per line, a blank line between sentences"


def _shown(text: str) -> str:
  return repr(text if len(text) <= 40 else text[:37] + "...")


def conll_problem(cols: list[str]) -> str | None:
  """Why one non-blank line, split at tabs, cannot be a CoNLL `word<TAB>TAG` line (what it looks like
  instead), or None. The one format check of every CoNLL-style reader, with `MAX_SENTENCE_TOKENS`."""
  if len(cols) != 2:
    if len(cols) == 5 and cols[3].strip().lstrip("-").isdigit():
      like = "a WSD file (lemma, pos, sense, token_index, sentence)"
    elif len(cols) == 1 and len(cols[0].split()) > 1:
      like = "whitespace-separated text; put a TAB between word and TAG"
    else:
      like = None
    return (f"expected 2 tab-separated columns (word, TAG), got {len(cols)}"
            + (f": looks like {like}" if like else ""))
  word, tag = cols
  if not word.strip() or not tag.strip():
    return "empty word or tag"
  if len(tag.split()) > 1:
    return (f"the TAG column holds spaces ({_shown(tag)}): looks like a label<TAB>sentence file "
            f"(sentiment TSV), not {_CONLL}")
  if len(word.split()) > 1:
    return (f"the word column holds spaces ({_shown(word)}): looks like a sentence<TAB>label file, "
            f"not {_CONLL}")
  return None


def read_conll(path: str) -> list[TaggedSentence]:
  """Reads `word<TAB>TAG` lines with blank lines between sentences; refuses, naming the line and what it
  looks like, a file that cannot be CoNLL (`conll_problem`, `MAX_SENTENCE_TOKENS`)."""
  out, tokens, tags, first = [], [], [], 0
  for number, line in _lines(path):
    if not line.strip():
      if tokens:
        out.append(TaggedSentence(tuple(tokens), tuple(tags), first))
      tokens, tags = [], []
      continue
    cols = line.split("\t")
    problem = conll_problem(cols)
    if problem is not None:
      raise InputError(f"{path}:{number}: {problem}")
    word, tag = cols
    if not tokens:
      first = number
    if len(tokens) >= MAX_SENTENCE_TOKENS:
      if not out:
        raise InputError(f"{path}:{number}: {MAX_SENTENCE_TOKENS} lines without a blank line between sentences: "
                         f"looks like one record per line (e.g. a label<TAB>sentence file), not {_CONLL}")
      raise InputError(f"{path}:{first}: a sentence of more than {MAX_SENTENCE_TOKENS} tokens (from line "
                       f"{first} to {number}): a missing blank line between sentences? ({_CONLL})")
    tokens.append(word)
    tags.append(tag)
  if tokens:
    out.append(TaggedSentence(tuple(tokens), tuple(tags), first))
  if not out:
    raise InputError(f"{path}: no sentences")
  return out


def _conll_like(stats: dict[str, int]) -> bool:
  """A `label<TAB>sentence` file that is a CoNLL file: most lines are two whitespace-separated fields
  (word, tag), in blocks of several lines separated by blank lines."""
  rows, pairs, breaks = stats["rows"], stats["pairs"], stats["breaks"]
  return rows >= 2 and breaks >= 1 and pairs >= 0.8 * rows and rows / (breaks + 1) >= 2


def read_labelled(path: str) -> list[LabelledSentence]:
  """Reads `label<TAB>sentence` lines; the sentence is tokenized. A CoNLL `word<TAB>TAG` file (which has
  two tab-separated columns too) is refused, naming this file (`_conll_like`)."""
  out = []
  stats = {"rows": 0, "pairs": 0, "breaks": 0}
  blank_before = False
  for number, line in _lines(path):
    if not line.strip():
      blank_before = bool(out)
      continue
    stats["rows"] += 1
    stats["pairs"] += len(line.split()) == 2
    stats["breaks"] += blank_before
    blank_before = False
    label, sentence = _columns(path, number, line, 2, "label, sentence")
    tokens = tuple(tokenize(sentence))
    if not label.strip():
      raise InputError(f"{path}:{number}: empty label")
    if not tokens:
      raise InputError(f"{path}:{number}: empty sentence")
    out.append(LabelledSentence(label.strip(), tokens, number))
  if not out:
    raise InputError(f"{path}: no examples")
  if _conll_like(stats):
    raise InputError(f"{path}: looks like a CoNLL word<TAB>TAG file ({stats['pairs']} of {stats['rows']} lines "
                     f"are one word and one tag, in {stats['breaks'] + 1} blank-line separated blocks), not "
                     "label<TAB>sentence")
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
