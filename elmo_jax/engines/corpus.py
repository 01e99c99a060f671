"""A corpus as an engine's work: the input files (globs, gzip, `gs://`) named once, each scanned once (its lines,
sha256 and the lines that are not UTF-8), cut into shards of whole chunks of the embed command, and a shard's
lines read back where it runs, each bad line named by its file and line number.

A line's index is its place in the corpus: the files in the order given (a glob's matches sorted), lines
counted from 0. With one input file it is the line's index in that file, the name the embed command gives its
dataset. A shard starts at a multiple of `shard_lines` of its file and holds whole chunks of `chunk_size`
lines, so its batches are the embed command's batches of the same lines, and so are their bits.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import glob
import hashlib
import os
from typing import Iterator, Sequence

from elmo_jax.embedding import inputs as embed_inputs
from elmo_jax.runtime import storage

_GLOB_CHARS = "*?["


class CorpusError(ValueError):
  """An input that cannot be embedded (no file matches, a file is missing or damaged); one line."""


@dataclasses.dataclass(frozen=True)
class InputFile:
  """One input file as a scan found it."""
  path: str  # as named (a gs:// URL stays one; each worker reads its own local copy)
  lines: int
  sha256: str
  bytes: int
  first_index: int  # the corpus index of its line 0
  offsets: tuple[int, ...] | None  # byte offset of line k * shard_lines, k = 0, 1, ...; None: gzip (skipped to)
  bad: tuple[tuple[int, str], ...]  # (line, why) of every line that is not UTF-8


@dataclasses.dataclass(frozen=True)
class Shard:
  """`lines` lines of `path` from `first_line` (corpus index `first_index`), written as shard `number`."""
  number: int
  path: str
  first_line: int
  lines: int
  first_index: int
  offset: int | None  # where `first_line` starts in the file (None: gzip, read from the start)


def expand(patterns: Sequence[str]) -> list[str]:
  """Input files in order: each of `patterns` (also comma-separated) a path, a `gs://` URL or a glob of either
  (its matches sorted); a file named twice is read once. CorpusError when a pattern names nothing."""
  out: list[str] = []
  for pattern in (p.strip() for item in patterns for p in item.split(",")):
    if not pattern:
      continue
    if not any(c in pattern for c in _GLOB_CHARS):
      if not storage.isfile(pattern):  # a folder (a bucket prefix) too: a file is read, never a tree
        raise CorpusError(f"{pattern}: input file not found" if not storage.exists(pattern) else
                          f"{pattern} is a folder, not a file; give a glob of its files (e.g. {pattern.rstrip('/')}/*)")
      matches = [pattern]
    elif storage.is_remote(pattern):
      matches = _bucket_glob(pattern)
    else:
      matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    if not matches:
      raise CorpusError(f"--input_file={pattern} matches no file")
    out += [m for m in matches if m not in out]
  if not out:
    raise CorpusError("--input_file names no file")
  return out


def _bucket_glob(pattern: str) -> list[str]:
  """The objects a `gs://` glob matches, sorted: one listing of the prefix before its first wildcard, each URL
  matched part by part between slashes, as a local glob matches (`*` stays within a part)."""
  prefix = pattern[:min(pattern.index(c) for c in _GLOB_CHARS if c in pattern)].rsplit("/", 1)[0]
  parts = pattern.split("/")
  if len(prefix.split("/")) < 3:  # "gs:", "", bucket
    raise CorpusError(f"--input_file={pattern}: a wildcard in a bucket's name; name the bucket")
  try:
    objects = storage.list_objects(prefix)
  except FileNotFoundError:  # no such bucket or prefix
    return []
  urls = (info["url"] for info in objects.values())  # keyed by the path under `prefix`
  return sorted(u for u in urls if len(u.split("/")) == len(parts)
                and all(fnmatch.fnmatchcase(a, b) for a, b in zip(u.split("/"), parts)))


def scan(path: str, shard_lines: int) -> dict:
  """One pass over `path` (a local copy of a `gs://` object): lines, sha256, bytes, the shard offsets and the
  lines that are not UTF-8, as `InputFile`'s fields (less `first_index`; JSON-able, for a Ray task)."""
  local = storage.local(path)
  if not os.path.isfile(local):
    raise CorpusError(f"{path}: input file not found")
  digest, size, line, offset, offsets, bad = hashlib.sha256(), 0, 0, 0, [], []
  gzipped = embed_inputs.is_gzip(local)
  with embed_inputs.open_binary(local) as f:
    while True:
      try:
        raw = f.readline()
      except (OSError, EOFError) as e:  # a damaged .gz
        raise CorpusError(f"{path}:{line + 1}: cannot read the file further ({e})") from None
      if not raw:
        break
      if line % shard_lines == 0:
        offsets.append(offset)
      why = embed_inputs.decode_line(raw)[1]
      if why is not None:
        bad.append((line, why))
      digest.update(raw)
      offset += len(raw)
      line += 1
  size = offset
  return {"path": path, "lines": line, "sha256": digest.hexdigest(), "bytes": size,
          "offsets": None if gzipped else offsets, "bad": bad}


def input_files(scans: Sequence[dict]) -> list[InputFile]:
  """The scans, in input order, with each file's first corpus index."""
  out, first = [], 0
  for s in scans:
    out.append(InputFile(s["path"], s["lines"], s["sha256"], s["bytes"], first,
                         None if s["offsets"] is None else tuple(s["offsets"]),
                         tuple((int(line), why) for line, why in s["bad"])))
    first += s["lines"]
  return out


def shards(files: Sequence[InputFile], shard_lines: int) -> list[Shard]:
  """Every file cut into shards of `shard_lines` lines (a file's last one shorter), numbered in corpus order."""
  out = []
  for f in files:
    for k, start in enumerate(range(0, f.lines, shard_lines)):
      out.append(Shard(len(out), f.path, start, min(shard_lines, f.lines - start), f.first_index + start,
                       None if f.offsets is None else f.offsets[k]))
  return out


def read_shard(shard: Shard) -> Iterator[tuple[int, str | None, str | None]]:
  """(line in its file, stripped text or None, why it is bad or None) of each line of `shard`, read from this
  machine's copy of its file (`storage.local`: a bucket object is downloaded once per machine)."""
  local = storage.local(shard.path)
  with embed_inputs.open_binary(local) as f:
    if shard.offset is not None:
      f.seek(shard.offset)
    else:
      for _ in range(shard.first_line):  # gzip: no seeking; decompressing costs far less than embedding
        f.readline()
    for line in range(shard.first_line, shard.first_line + shard.lines):
      try:
        raw = f.readline()
      except (OSError, EOFError) as e:
        raise CorpusError(f"{shard.path}:{line + 1}: cannot read the file further ({e})") from None
      if not raw:
        raise CorpusError(f"{shard.path}: it ends at line {line} but was scanned with more lines; it changed "
                          "during the job")
      yield (line, *embed_inputs.decode_line(raw))
