"""Atomic file writes: a reader (or a crash) never sees a half-written file."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import numpy as np


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp", prefix: str | None = None) -> Iterator[str]:
  """Yields a temporary path beside `path`; renamed onto it on success, removed on failure.

  The temp file is named `prefix` (default `NAME.`) + random + `suffix`, in the same directory so the
  rename is atomic (never a copy across file systems), and gets the permissions a plainly created file
  would (the umask's), not mkstemp's 0600.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix or os.path.basename(path) + ".", suffix=suffix)
  os.close(fd)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)
  try:
    yield tmp
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[str]:
  """`atomic_path` for a folder: yields an empty folder beside `path`, swapped in for `path` on success.

  A reader sees the old folder or the new one, never a mix; on failure the temporary folder is removed. One
  writer per folder: `path.tmp` left by a killed writer is cleared first.
  """
  final = os.path.abspath(path)
  tmp, old = final + ".tmp", final + ".old"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
      os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def write_text(path: str | os.PathLike, text: str) -> None:
  with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
    f.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
  write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def looks_like(path: str | os.PathLike) -> str:
  """What a file is, from its first bytes, for messages about a file of the wrong kind:
  'a directory', 'an HDF5 file', 'a JSON file', 'an empty file', 'a text file' or 'binary data'."""
  if os.path.isdir(path):
    return "a directory"
  with open(path, "rb") as f:
    head = f.read(512)
  if not head:
    return "an empty file"
  if head.startswith(_HDF5_MAGIC):
    return "an HDF5 file"
  if head.lstrip()[:1] in (b"{", b"["):
    return "a JSON file"
  try:
    head.decode("utf-8")
  except UnicodeDecodeError as e:
    if e.start < len(head) - 4:  # not just a character cut at the 512-byte boundary
      return "binary data"
  return "a text file"


def first_difference(saved: dict, wanted: dict, prefix: str = "") -> str:
  """'a.b is 1 there, 2 here' for the first key (nested dicts by dotted path) where two settings differ;
  "" if they agree. For refusing a run whose saved state was made with other settings."""
  for key in sorted(set(saved) | set(wanted)):
    a, b = saved.get(key), wanted.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      found = first_difference(a, b, f"{prefix}{key}.")
      if found:
        return found
    elif a != b:
      return f"{prefix}{key} is {json.dumps(a)[:80]} there, {json.dumps(b)[:80]} here"
  return ""


def sha256_arrays(*arrays: Any, extra: Any = None) -> str:
  """sha256 of JSON `extra` and the dtypes, shapes and bytes of `arrays` (e.g. a model's params)."""
  digest = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
  for a in arrays:
    a = np.ascontiguousarray(np.asarray(a))
    digest.update(f"{a.dtype}{a.shape}".encode())
    digest.update(a.tobytes())
  return digest.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
  """sha256 hex digest of a file's bytes, read in 4 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()
