"""Atomic file writes: a reader (or a crash) never sees a half-written file."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
  """Yields a temporary path beside `path`; renamed onto it on success, removed on failure."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=suffix)
  os.close(fd)
  try:
    yield tmp
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str | os.PathLike, text: str) -> None:
  with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
    f.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
  write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")
