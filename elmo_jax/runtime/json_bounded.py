"""JSON from outside (a model's options.json, config.json, a safetensors header, an EFML architecture, a job's
record) parsed with a size and a nesting-depth limit: Python's parser recurses once per level, so a few KB of
`[[[[...` end in a RecursionError traceback, and a size is known before the text is read whole.

    obj = json_bounded.load(path)                  # or loads(text, where=...)

`JSONLimitError` is a ValueError (the readers' `except ValueError` already makes one line of a bad JSON).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

MAX_DEPTH = 64  # the deepest file elmo_jax reads nests 4 levels (config.json: options.char_cnn.filters[i])
MAX_BYTES = 16 * 2**20  # an options.json is ~500 bytes, a safetensors header of the 5.5B model ~20 KB

# A JSON string (its escapes included): brackets inside one do not nest.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STEP = np.zeros(256, np.int8)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1


class JSONLimitError(ValueError):
  """A JSON text over the size or depth this reader accepts; the message names the source."""


def depth(text: str) -> int:
  """How deep `text`'s arrays and objects nest (0 for a scalar), brackets inside strings not counted."""
  steps = _STEP[np.frombuffer(_STRING.sub('""', text).encode("utf-8", "surrogatepass"), np.uint8)]
  steps = steps[steps != 0]
  return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _error(where: str, why: str) -> JSONLimitError:
  return JSONLimitError(f"{where}: {why}" if where else why)


def loads(text: str | bytes, where: str = "", max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
  """`json.loads(text)` after the limits: JSONLimitError over them (naming `where` if given: a reader that
  names its file itself passes none); json.JSONDecodeError or UnicodeDecodeError (ValueErrors) as json.loads
  raises them."""
  if len(text) > max_bytes:
    raise _error(where, f"{len(text):,} bytes of JSON, over the {max_bytes:,} accepted")
  if isinstance(text, (bytes, bytearray)):
    text = bytes(text).decode("utf-8")
  if depth(text) > max_depth:
    raise _error(where, f"JSON nested deeper than {max_depth} levels")
  return json.loads(text)


def load(path: str | os.PathLike, where: str = "", max_bytes: int = MAX_BYTES,
         max_depth: int = MAX_DEPTH) -> Any:
  """`loads` of a UTF-8 file, its size checked before it is read; OSError as open raises it."""
  with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    if size > max_bytes:
      raise _error(where, f"{size:,} bytes of JSON, over the {max_bytes:,} accepted")
    return loads(f.read(max_bytes + 1), where, max_bytes, max_depth)
