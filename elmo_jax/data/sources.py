"""Random-access sentence sources (`__len__`, `__getitem__ -> str`), usable as Grain `MapDataset` sources."""
from __future__ import annotations

import glob
import logging
import os
from typing import Sequence

import numpy as np

from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime import streams

log = logging.getLogger(__name__)


LIST_HINT = ("a list of files is comma-separated paths or globs; a path whose name holds a comma or glob "
             "characters is taken as it is when that file exists")


def split_paths(value: str) -> list[str]:
  """The items of a comma-separated list of paths or globs (`config.data.train_files`, `--input`): split at
  commas, except that an existing file wins: the whole value when it names one, else the longest run of items
  that, joined by their commas, names one (`a,b.txt` that exists is one file). Items are stripped; empty ones
  dropped."""
  value = value.strip()
  if not value:
    return []
  if os.path.lexists(value):
    return [value]
  parts = value.split(",")
  items, i = [], 0
  while i < len(parts):
    j = i + 1
    if not os.path.lexists(parts[i].strip()):  # only a missing item may be the start of a name with a comma
      j = next((k for k in range(len(parts), i + 1, -1) if os.path.lexists(",".join(parts[i:k]).strip())), j)
    item = ",".join(parts[i:j]).strip()
    if item:
      items.append(item)
    i = j
  return items


def expand_paths(paths_or_globs: str | Sequence[str]) -> list[str]:
  """The files of paths and globs, in order (a glob's matches sorted); a literal path that exists wins over
  glob syntax (`train[1].txt`). FileNotFoundError naming a pattern that matches nothing, a missing file, a
  directory or a broken link."""
  patterns = [paths_or_globs] if isinstance(paths_or_globs, (str, os.PathLike)) else list(paths_or_globs)
  paths: list[str] = []
  for pattern in patterns:
    pattern = os.fspath(pattern)
    if storage.is_remote(pattern):  # an object is read from its local copy (downloaded once)
      if glob.has_magic(pattern):
        raise FileNotFoundError(f"{pattern}: patterns are not expanded in a bucket; list the objects")
      pattern = storage.local(pattern)
    literal = not glob.has_magic(pattern) or os.path.lexists(pattern)
    matches = [pattern] if literal else sorted(glob.glob(pattern))
    if not matches:
      raise FileNotFoundError(f"text source pattern {pattern!r} matches no file")
    for path in matches:
      if os.path.isdir(path):
        raise FileNotFoundError(f"{path} is a directory, not a text file")
      if not os.path.isfile(path) and not files.is_stream(path):  # a pipe is read once, by TextSource
        broken = os.path.islink(path)  # a link to nothing, or a loop of links
        raise FileNotFoundError(f"{path}: " + ("a symbolic link to no file (broken, or a loop of links)"
                                               if broken else "file not found"))
    paths.extend(matches)
  if not paths:
    raise ValueError("TextSource needs at least one path or glob")
  return paths


def _refuse_mostly_invalid(path: str, good: int, invalid: int, first: str) -> None:
  """A file most of whose non-empty lines are not UTF-8 is binary data (an HDF5 file, a model) or another
  encoding, not a corpus with a few bad lines: refused (ValueError, one line) instead of training on the few
  byte runs that happen to decode."""
  if invalid * 2 > good + invalid:
    raise ValueError(f"{path}: {invalid:,} of its {good + invalid:,} non-empty lines are not valid UTF-8 (first at "
                     f"{first}): binary data or another encoding, not a text corpus")


_CR_HEAD = 1 << 20  # how much of a file is looked at for its line endings
_CR_MIN = 1000  # a shorter file without a newline may well be one sentence


def _refuse_cr_only(path: str, first_line: bytes) -> None:
  """A file (over 1000 bytes) whose first MiB holds carriage returns but no newline (its first line, as read)
  has old-Mac line endings: read line by line it would be one huge sentence. Refused (ValueError, one line)
  with the fix."""
  head = first_line[:_CR_HEAD]
  if len(head) > _CR_MIN and b"\r" in head and b"\n" not in head:
    raise ValueError(f"{path} uses CR-only line endings (old Mac), it would be read as one line; convert with "
                     "tr '\\r' '\\n'")


class TextSource:
  """Plain or gzip text files (gzip by its magic number), one sentence (or paragraph) per line, each read once
  (a pipe or FIFO works).

  Everything is read into one bytes buffer at construction (random access into gzip is otherwise
  impossible); a compact buffer + offsets costs ~1 byte per character instead of a Python str per line.
  Lines that are empty (after stripping whitespace) or not valid UTF-8 are skipped and counted in
  `skipped` (`{"invalid_utf8": n, "empty": m}`); `first_skipped` names the first `file:line` per reason. A
  file with more invalid than valid non-empty lines is refused (ValueError naming it): binary data; so is
  one with CR-only (old Mac) line endings, which would be one huge line.
  """

  def __init__(self, paths_or_globs: str | Sequence[str]):
    self.paths = expand_paths(paths_or_globs)
    self.skipped: dict[str, int] = {"invalid_utf8": 0, "empty": 0}
    self.first_skipped: dict[str, str] = {}
    chunks: list[bytes] = []
    lengths: list[int] = []
    for path in self.paths:
      kept = len(lengths)  # the lines of the files before this one
      invalid = self.skipped["invalid_utf8"]
      first_invalid = ""
      try:
        with streams.open_text(path) as f:  # opened once: a pipe or FIFO works, checked from its first block
          for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
              _refuse_cr_only(path, raw)
            line = raw.strip()
            reason = None
            if not line:
              reason = "empty"
            else:
              try:
                line.decode("utf-8")  # strict: a mis-encoded line would put garbage chars into the model
              except UnicodeDecodeError:
                reason = "invalid_utf8"
                first_invalid = first_invalid or f"{path}:{lineno}"
            if reason is not None:
              self.skipped[reason] += 1
              self.first_skipped.setdefault(reason, f"{path}:{lineno}")
              continue
            chunks.append(line)
            lengths.append(len(line))
      except (OSError, EOFError) as e:  # e.g. truncated gzip
        raise OSError(f"{path}: cannot read text source ({e})") from e
      _refuse_mostly_invalid(path, len(lengths) - kept, self.skipped["invalid_utf8"] - invalid,
                             first_invalid)
    self._buffer = b"".join(chunks)
    self._offsets = np.zeros([len(lengths) + 1], dtype=np.int64)
    np.cumsum(lengths, out=self._offsets[1:])
    if any(self.skipped.values()):
      log.warning("TextSource skipped lines %s (first at %s)", self.skipped, self.first_skipped)
    if not lengths:
      raise ValueError(f"text source {self.paths} has no usable lines (skipped: {self.skipped})")

  def __len__(self) -> int:
    return len(self._offsets) - 1

  def __getitem__(self, index: int) -> str:
    if not -len(self) <= index < len(self):
      raise IndexError(f"TextSource index {index} out of range [0, {len(self)})")
    index %= len(self)
    return self._buffer[self._offsets[index] : self._offsets[index + 1]].decode("utf-8")

  def __repr__(self) -> str:
    return f"TextSource({len(self.paths)} files, {len(self)} lines, skipped={self.skipped})"


def local_tfds_dir(data_dir: str | None, name: str) -> str | None:
  """TFDS's `data_dir` for reading dataset `name` ("glue/sst2", "lm1b:1.1.0"): itself, or for a bucket URL the
  local copy of the bucket's data_dir holding a copy of that one dataset (of the many a data_dir may hold)."""
  if not storage.is_remote(data_dir):
    return data_dir
  storage.local(storage.join(data_dir, name.split(":")[0]))
  return storage.copy_path(data_dir)


class TfdsSource:
  """A TFDS split read through `tfds.data_source` (ArrayRecord random access; no TensorFlow needed).

  `TfdsSource("lm1b", "train")` reads the real 1B Word Benchmark once it is prepared in `data_dir`.
  Records that are not valid UTF-8 decode with U+FFFD replacement (a random-access source cannot drop
  an index) and are counted in `skipped["invalid_utf8"]`; the pipeline drops empty sentences.
  """

  def __init__(
      self, name: str, split: str, data_dir: str | None = None, text_key: str = "text", download: bool = False
  ):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow import, only when used)

    self.name = name
    self.split = split
    self.text_key = text_key
    try:
      data_dir = local_tfds_dir(data_dir, name)
      self._source = tfds.data_source(name, split=split, data_dir=data_dir, download=download)
    except Exception as e:  # tfds raises a zoo of types; the message is what the user needs
      raise ValueError(
          f"tfds dataset {name!r} split {split!r} is not available under data_dir={data_dir!r} "
          f"(prepare it first, e.g. `tfds build {name} --file_format=array_record`): {e}"
      ) from e
    self.skipped: dict[str, int] = {"invalid_utf8": 0}

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> str:
    record = self._source[index]
    if self.text_key not in record:
      raise KeyError(f"tfds {self.name}/{self.split}: record has no key {self.text_key!r} (keys: {sorted(record)})")
    text = record[self.text_key]
    if isinstance(text, str):
      return text
    try:
      return bytes(text).decode("utf-8")
    except UnicodeDecodeError:
      self.skipped["invalid_utf8"] += 1
      return bytes(text).decode("utf-8", errors="replace")

  def __repr__(self) -> str:
    return f"TfdsSource({self.name!r}, split={self.split!r}, {len(self)} records)"
