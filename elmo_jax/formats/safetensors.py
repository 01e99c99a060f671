"""safetensors files (Hugging Face's tensor format), read and written with numpy; every header checked first.

    safetensors.save(path, {"bilm/char_cnn/char_embed": table, ...}, metadata={"format": "elmo_jax"})
    tensors, metadata = safetensors.load(path)           # {name: float32 numpy}, {str: str}; one line if not

The layout (huggingface/safetensors' README): 8 bytes, a little-endian u64 N; N bytes of a UTF-8 JSON object,
{name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {str: str}} (padded with
spaces to a multiple of 8); then the tensors' bytes, little-endian, C order, `data_offsets` relative to the
byte after the header. Names are written sorted, their bytes in that order, back to back.

Why a numpy reader of our own, not the `safetensors` package: the format is a length, a JSON header and raw
bytes, so reading it is the checks below plus `np.frombuffer`; the checks must run before any parser anyway
(a header size cap, a dtype allow-list, offsets that tile the file exactly), after them the package would add
nothing but a compiled dependency on every machine that loads a model. The tests read what this writes with
the package, and this reads what the package writes (tests/interop/test_safetensors.py), bit for bit.

Refused in one line naming the file (`SafetensorsError`, a `weights.WeightFileError`): a file shorter than its
header says, a header over `MAX_HEADER` bytes, not a JSON object, a dtype outside `DTYPES`, a rank over
`MAX_RANK`, a negative or non-integer dimension, offsets whose span is not what the dtype and shape need, that
overlap, leave a gap or end anywhere but at the file's end, and (`load`'s caller) non-finite values.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from elmo_jax.formats.weights import WeightFileError
from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded

# The dtypes read (safetensors' names -> numpy, little-endian); the floats a model's parameters may be stored in
# (`weights.checked` makes them float32). Integer and bool tensors have no place in a model here.
DTYPES = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "F64": np.dtype("<f8")}
MAX_HEADER = 1 << 20  # an ELMo's header is a few kB (a hundred tensors); the package's own cap is 100 MB
MAX_RANK = 8
METADATA = "__metadata__"


class SafetensorsError(WeightFileError):
  """A safetensors file that breaks the format or the bounds above; the message names the file."""


def _dims(shape: Any, where: str) -> tuple[int, ...]:
  if not isinstance(shape, list) or len(shape) > MAX_RANK:
    raise SafetensorsError(f"{where}: shape must be a list of at most {MAX_RANK} dimensions, got {shape!r:.80}")
  if not all(type(d) is int and d >= 0 for d in shape):  # noqa: E721 - bool is an int: refused too
    raise SafetensorsError(f"{where}: shape {shape!r:.80} has a dimension that is not a non-negative integer")
  return tuple(shape)


def _entry(name: str, entry: Any, where: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
  """(dtype, shape, begin, end) of one header entry, each checked against the format and `DTYPES`."""
  where = f"{where}: tensor '{name[:80]}'"
  if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
    raise SafetensorsError(f"{where}: an entry holds exactly dtype, shape and data_offsets")
  if entry["dtype"] not in DTYPES:
    raise SafetensorsError(f"{where}: dtype {entry['dtype']!r:.20} is not one read ({', '.join(DTYPES)})")
  dtype, shape = DTYPES[entry["dtype"]], _dims(entry["shape"], where)
  offsets = entry["data_offsets"]
  if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)  # noqa: E721
      or not 0 <= offsets[0] <= offsets[1]):
    raise SafetensorsError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r:.80}")
  need = dtype.itemsize * int(np.prod(shape, dtype=object))
  if offsets[1] - offsets[0] != need:
    raise SafetensorsError(f"{where}: data_offsets span {offsets[1] - offsets[0]:,} bytes; {entry['dtype']} of "
                           f"shape {list(shape)} is {need:,}")
  return dtype, shape, offsets[0], offsets[1]


def read_header(path: str | os.PathLike) -> tuple[dict[str, tuple[np.dtype, tuple[int, ...], int, int]],
                                                  dict[str, str], int]:
  """({name: (dtype, shape, begin, end)}, metadata, where the data starts) of a safetensors file, every entry
  checked and the entries tiling the data to the file's end exactly; nothing else is read."""
  path = os.fspath(path)
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise SafetensorsError(f"{path}: {size} bytes, shorter than a safetensors header (truncated?)")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER:
      raise SafetensorsError(f"{path}: header of {n:,} bytes, over the {MAX_HEADER:,} a model's header may be")
    if 8 + n > size:
      raise SafetensorsError(f"{path}: header of {n:,} bytes in a file of {size:,} (truncated?)")
    raw = f.read(n)
  try:
    header = json_bounded.loads(raw, max_bytes=MAX_HEADER)
  except (UnicodeDecodeError, ValueError) as e:
    raise SafetensorsError(f"{path}: header is not UTF-8 JSON ({' '.join(str(e).split())[:80]})") from None
  if not isinstance(header, dict):
    raise SafetensorsError(f"{path}: header is a JSON {type(header).__name__}, not an object")
  metadata = header.pop(METADATA, None) or {}
  if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
    raise SafetensorsError(f"{path}: {METADATA} must map names to strings")
  entries = {name: _entry(name, entry, path) for name, entry in header.items()}
  at = 0
  for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
    if begin != at:
      raise SafetensorsError(f"{path}: tensor '{name[:80]}' starts at byte {begin:,} of the data, expected "
                             f"{at:,} (tensors overlap or leave a gap)")
    at = end
  if 8 + n + at != size:
    raise SafetensorsError(f"{path}: the tensors end at byte {8 + n + at:,}, the file at {size:,} "
                           f"({'truncated?' if size < 8 + n + at else 'bytes after the last tensor'})")
  return entries, metadata, 8 + n


def load(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """({name: numpy array of its dtype}, metadata) of a safetensors file whose header passes `read_header`.
  The values are not checked here: the caller checks them against the model (`weights.checked`)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise SafetensorsError(f"{path}: not found")
  entries, metadata, start = read_header(path)
  out = {}
  with open(path, "rb") as f:
    for name, (dtype, shape, begin, end) in entries.items():
      f.seek(start + begin)
      data = f.read(end - begin)
      if len(data) != end - begin:  # the file shrank after its size was read
        raise SafetensorsError(f"{path}: tensor '{name}' is cut short (the file changed while read?)")
      out[name] = np.frombuffer(data, dtype).reshape(shape).copy()
  return out, metadata


def save(path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
  """Writes `tensors` (each stored with its own float dtype, little-endian) atomically, names sorted."""
  arrays, header, at = {}, {}, 0
  for name in sorted(tensors):
    a = np.asarray(tensors[name], order="C")  # not ascontiguousarray: it makes a 0-d tensor 1-d
    code = next((c for c, d in DTYPES.items() if d == a.dtype.newbyteorder("<")), None)
    if code is None:
      raise SafetensorsError(f"{path}: tensor '{name}' is {a.dtype.name}; the dtypes written are {', '.join(DTYPES)}")
    arrays[name] = a.astype(DTYPES[code], copy=False)
    header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
    at += a.nbytes
  if metadata:
    header = {METADATA: dict(metadata), **header}
  raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
  raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the package writes it
  with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for a in arrays.values():
      f.write(a.tobytes())
