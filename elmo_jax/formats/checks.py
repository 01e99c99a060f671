"""What a downloaded or cached file must be: `check_kind(path, kind=...)`, the one cache-entry validator.

    check_kind("weights.hdf5")                 # None: a readable HDF5 file (the kind is inferred from the name)
    check_kind("reply.json", kind="options")  # "not an ELMo options.json (...)": e.g. a server's error reply

`elmo_jax.sources.download` runs it on a fresh download before it is renamed into place and on every
cached file before it is used; a problem is one line (why the file is not what it must be).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import h5py

from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded

KINDS = ("hdf5", "json", "options")


def one_line(x: Any, limit: int = 200) -> str:
  """`str(x)` with its whitespace runs made single spaces, cut to `limit` characters (a message's part)."""
  text = " ".join(str(x).split())
  return text if len(text) <= limit else text[:limit - 3] + "..."


def require_kind(kind: str | None) -> None:
  """Raises ValueError unless `kind` is None or one of `KINDS` (a caller's mistake, not a file's)."""
  if kind is not None and kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _touch_hdf5(_: str, obj: Any) -> None:
  """Reads an object's header (and a dataset's shape and type), so damaged metadata raises."""
  if isinstance(obj, h5py.Dataset):
    _ = obj.shape, obj.dtype
  _ = list(obj.attrs.keys())


def _kind_of(name: str) -> str | None:
  name = name.lower()
  if name.endswith((".hdf5", ".h5")):
    return "hdf5"
  if name.endswith(".json"):
    return "json"
  return None


def _hdf5_problem(path: str | os.PathLike) -> str | None:
  """Why `path` is not a readable HDF5 file (every object's header is read: a truncated file fails)."""
  try:
    with h5py.File(path, "r") as f:
      f.visititems(_touch_hdf5)
  except Exception as e:  # noqa: BLE001 - h5py raises OSError, KeyError, RuntimeError... for damaged files
    looks = files.looks_like(path)
    return (f"not a readable HDF5 file (truncated? {one_line(e)})" if looks == "an HDF5 file" else
            f"not an HDF5 file (it is {looks})")
  return None


def _json_problem(path: str | os.PathLike, options: bool) -> str | None:
  """Why `path` is not a JSON object (`options`: one that passes `elmo_jax.formats.options.validate`)."""
  try:
    obj = json_bounded.load(path)
  except json_bounded.JSONLimitError as e:
    return f"not a JSON file this reader accepts ({e})"
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    looks = files.looks_like(path)
    return (f"not a readable JSON file (truncated? {one_line(e)})" if looks == "a JSON file" else
            f"not a JSON file (it is {looks})")
  if not isinstance(obj, dict):
    return f"not a JSON object (it holds a JSON {type(obj).__name__})"
  if options:
    from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
    try:
      options_lib.validate(obj, source="options")
    except ValueError as e:
      why = one_line(str(e).removeprefix("options: "), 120)
      return f"not an ELMo options.json ({why}; it holds {one_line(json.dumps(obj), 80)})"
  return None


def check_kind(path: str | os.PathLike, name: str | None = None, kind: str | None = None) -> str | None:
  """The one cache-entry validator: why `path` is not what it must be, else None.

  `kind` is what the caller needs (one of `KINDS`); None infers it from the name (`name`, default `path`):
  `.hdf5`/`.h5` -> "hdf5", `.json` -> "json", other names: no check (None).
  "hdf5": opens with h5py and every object's header reads (a truncated file fails); "json": parses as a
  JSON object; "options": a JSON object that passes `elmo_jax.formats.options.validate` (e.g. not a server's
  `{"error": ...}` reply). Used on a fresh download before it is renamed into place and its hash
  recorded, and on every cached file before it is used.
  """
  if kind is None:
    kind = _kind_of(os.fspath(name or path))
  else:
    require_kind(kind)
  if kind == "hdf5":
    return _hdf5_problem(path)
  if kind in ("json", "options"):
    return _json_problem(path, options=kind == "options")
  return None


def check(path: str, name: str, kind: str | None, validate: Callable[[str], str | None] | None) -> str | None:
  """`check_kind`, then the caller's `validate(path)` (a problem string, None, or a ValueError/OSError)."""
  problem = check_kind(path, name=name, kind=kind)
  if problem is None and validate is not None:
    try:
      problem = validate(path)
    except (ValueError, OSError) as e:
      problem = one_line(e)
  return problem
