"""TensorFlow tensor bundles written without TensorFlow (the inverse of formats/tf_bundle.py's reader): a
valid bundle of given tensors, or one whose index says what it should not (a negative offset, a size of
2^40, a dtype or rank the model does not expect), for the index-check and fuzz tests."""
from __future__ import annotations

import os
import struct

import numpy as np

from elmo_jax.formats import crc32c
from elmo_jax.formats import tf_bundle

_CODES = {np.dtype(v): k for k, v in tf_bundle._DTYPES.items()}  # pylint: disable=protected-access
_MAGIC = 0xdb4775248b80fb57


def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1  # an int64 field: -5 is 2^64 - 5, as protobuf writes it
  out = bytearray()
  while True:
    out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
    n >>= 7
    if not n:
      return bytes(out)


def _field(number: int, value) -> bytes:
  if isinstance(value, bytes):
    return _varint(number << 3 | 2) + _varint(len(value)) + value
  return _varint(number << 3) + _varint(value)


def entry_bytes(dtype: int, shape, offset: int, size: int, crc: int, shard: int = 0) -> bytes:
  dims = b"".join(_field(2, _field(1, d)) for d in shape)
  return (_field(1, dtype) + _field(2, dims) + (_field(3, shard) if shard else b"") + _field(4, offset) +
          _field(5, size) + _varint(6 << 3 | 5) + struct.pack("<I", crc))


def _block(entries: list[tuple[bytes, bytes]]) -> bytes:
  body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in entries)
  return body + struct.pack("<I", 0) + struct.pack("<I", 1)  # one restart at 0


def _with_trailer(block: bytes) -> bytes:
  return block + b"\x00" + struct.pack("<I", crc32c.mask(crc32c.crc32c(block + b"\x00")))


def _string_bytes(values: list[bytes]) -> tuple[bytes, int]:
  lengths = b"".join(_varint(len(v)) for v in values)
  crc = 0
  for v in values:
    crc = crc32c.crc32c(struct.pack("<I", len(v)), crc)
  check = struct.pack("<I", crc32c.mask(crc))
  crc = crc32c.crc32c(check, crc)
  for v in values:
    crc = crc32c.crc32c(v, crc)
  return lengths + check + b"".join(values), crc


def write(prefix: str, tensors: dict, overrides: dict | None = None) -> None:
  """`prefix.index` + `prefix.data-00000-of-00001` holding `tensors` ({name: numpy array, or a list of
  bytes for a 1-D string tensor}); `overrides` {name: {"dtype"/"shape"/"offset"/"size": value}} edits what
  the index says (the crc32c stays the bytes')."""
  os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
  data, entries = bytearray(), [(b"", _field(1, 1) + _field(2, 0) + _field(3, _field(1, 1)))]
  for name in sorted(tensors):
    value = tensors[name]
    if isinstance(value, list):
      raw, crc = _string_bytes(value)
      dtype, shape = 7, (len(value),)
    else:
      raw = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
      crc, dtype, shape = crc32c.crc32c(raw), _CODES[value.dtype], value.shape
    fields = {"dtype": dtype, "shape": shape, "offset": len(data), "size": len(raw)}
    fields.update((overrides or {}).get(name, {}))
    entries.append((name.encode(), entry_bytes(fields["dtype"], fields["shape"], fields["offset"], fields["size"],
                                               crc32c.mask(crc))))
    data += raw
  with open(tf_bundle.data_file(prefix, 0, 1), "wb") as f:
    f.write(bytes(data))
  block = _with_trailer(_block(entries))
  index = _with_trailer(_block([(entries[-1][0] + b"\xff", _varint(0) + _varint(len(block) - 5))]))
  meta = _with_trailer(_block([]))
  body = block + index + meta
  handles = (_varint(len(block) + len(index)) + _varint(len(meta) - 5) + _varint(len(block)) +
             _varint(len(index) - 5))
  footer = handles + b"\x00" * (40 - len(handles)) + struct.pack("<Q", _MAGIC)
  with open(prefix + ".index", "wb") as f:
    f.write(body + footer)
