"""TensorFlow's checkpoint tensor bundle (`PREFIX.index` + `PREFIX.data-*-of-*`), read without TensorFlow.

    n_shards, entries = tf_bundle.read_index("module/variables/variables")  # {name: Entry}
    tensors = tf_bundle.read_tensors("module/variables/variables")  # {name: numpy array}, crc32c checked

The index is a LevelDB-style sorted table (tensorflow/core/lib/io/table_format.txt): data blocks of
prefix-compressed key/value entries, an index block of their handles, a 48-byte footer ending in the magic
0xdb4775248b80fb57; each block carries a masked crc32c of its bytes. Key "" holds a `BundleHeaderProto`, every
other key a tensor's `BundleEntryProto` (tensorflow/core/protobuf/tensor_bundle.proto): dtype, shape, shard,
offset, size and the masked crc32c of its bytes in the data file. The protos are decoded by the few lines of
varint reading below: no protobuf or TensorFlow dependency. A string tensor's bytes are
`[varint64 length]*n [masked crc32c of the lengths as uint32] [the strings]`, as `WriteStringTensor` writes them.
The checksums are `crc32c`'s (masked as TensorFlow stores them).

Every error is a `BundleError`, one line naming the file (and the tensor or block).
"""
from __future__ import annotations

import dataclasses
import os
import struct
from typing import Iterator

import numpy as np

from elmo_jax.formats.crc32c import crc32c, mask

_MAGIC = 0xdb4775248b80fb57
_FOOTER = 48
# tensorflow/core/framework/types.proto: the dtypes a checkpoint of ELMo (or its step counter) can hold.
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8, 9: np.int64,
           10: np.bool_, 19: np.float16}
_DT_STRING = 7


class BundleError(ValueError):
  """A bundle that cannot be read as TensorFlow wrote it; the message is one line naming the file."""


# --- protobuf wire format ------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
  result = shift = 0
  while True:
    if pos >= len(buf) or shift > 63:
      raise ValueError("truncated varint")
    b = buf[pos]
    pos += 1
    result |= (b & 0x7F) << shift
    if not b & 0x80:
      return result, pos
    shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
  """(field number, value) of a serialized message: an int (varint, fixed32/64) or bytes (length-delimited)."""
  pos = 0
  while pos < len(buf):
    key, pos = _varint(buf, pos)
    number = key >> 3
    wire = key & 7
    if wire == 0:
      value, pos = _varint(buf, pos)
    elif wire == 1:
      value = int.from_bytes(buf[pos:pos + 8], "little")
      pos += 8
    elif wire == 5:
      value = int.from_bytes(buf[pos:pos + 4], "little")
      pos += 4
    elif wire == 2:
      n, pos = _varint(buf, pos)
      value = buf[pos:pos + n]
      pos += n
    else:
      raise ValueError(f"unsupported wire type {wire}")
    if pos > len(buf):
      raise ValueError("truncated field")
    yield number, value


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor's `BundleEntryProto`: where its bytes are and what they hold."""
  dtype: int
  shape: tuple[int, ...]
  shard_id: int
  offset: int
  size: int
  crc32c: int  # masked
  sliced: bool


def _int(value) -> int:
  """A varint field's value as the int64 it encodes (-5 is stored as 2^64 - 5)."""
  if not isinstance(value, int):
    raise ValueError("a length-delimited field where a number belongs")
  return value - (1 << 64) if value >= 1 << 63 else value


def _message(value) -> bytes:
  """A length-delimited field's bytes: a nested message."""
  if not isinstance(value, bytes):
    raise ValueError("a number where a message belongs")
  return value


def _entry(message: bytes) -> Entry:
  """A serialized `BundleEntryProto` (fields absent: their proto defaults)."""
  got = {"dtype": 0, "shape": (), "shard_id": 0, "offset": 0, "size": 0, "crc32c": 0, "sliced": False}
  for number, value in _fields(message):
    if number == 1:
      got["dtype"] = _int(value)
    elif number == 2:  # TensorShapeProto: repeated Dim dim = 2 {int64 size = 1}
      dims = []
      for dim_number, dim in _fields(_message(value)):
        if dim_number == 2:
          dims.append(_int(next((size for k, size in _fields(_message(dim)) if k == 1), 0)))
      got["shape"] = tuple(dims)
    elif number in (3, 4, 5):
      got[("shard_id", "offset", "size")[number - 3]] = _int(value)
    elif number == 6:
      got["crc32c"] = value if isinstance(value, int) else _int(value)
    elif number == 7:
      got["sliced"] = True
  return Entry(**got)


_MAX_RANK = 32


def _entry_problem(entry: Entry) -> str | None:
  """Why an index entry cannot describe a tensor TensorFlow wrote (before it is believed), else None: a
  dtype read here, a rank and dims that are sane, an offset and size that are not negative, and a size
  that is what the dtype and shape need (numbers), or at least one byte an element (strings)."""
  if entry.dtype not in _DTYPES and entry.dtype != _DT_STRING:
    return f"has TensorFlow dtype {entry.dtype}, which is not read here"
  if len(entry.shape) > _MAX_RANK or any(d < 0 for d in entry.shape):
    return f"has shape {list(entry.shape)[:8]} (rank {len(entry.shape)}): not a tensor's shape"
  if entry.offset < 0 or entry.size < 0 or entry.shard_id < 0:
    return f"has offset {entry.offset}, size {entry.size}, shard {entry.shard_id}: negative"
  count = int(np.prod(entry.shape, dtype=object)) if entry.shape else 1
  if entry.dtype == _DT_STRING:
    return None if entry.size >= count + 4 else (f"has {entry.size} bytes for {count} strings (at least "
                                                 f"{count + 4} needed)")
  need = count * np.dtype(_DTYPES[entry.dtype]).itemsize
  return None if entry.size == need else (f"has {entry.size} bytes; shape {list(entry.shape)} of "
                                          f"{np.dtype(_DTYPES[entry.dtype]).name} needs {need}")


# --- the index table -----------------------------------------------------------------------------------
def _block(data: bytes, handle: bytes, where: str) -> list[tuple[bytes, bytes]]:
  """The (key, value) entries of the block a BlockHandle (varint64 offset, varint64 size) points at."""
  offset, pos = _varint(handle, 0)
  size, _ = _varint(handle, pos)
  if offset + size + 5 > len(data):
    raise BundleError(f"{where}: a block runs past the end of the file (truncated?)")
  contents = data[offset:offset + size]
  kind = data[offset + size]  # the block's compression type
  stored = int.from_bytes(data[offset + size + 1:offset + size + 5], "little")
  if mask(crc32c(data[offset:offset + size + 1])) != stored:
    raise BundleError(f"{where}: the block at byte {offset} fails its crc32c (the file is corrupt)")
  if kind != 0:
    raise BundleError(f"{where}: the block at byte {offset} is compressed (type {kind}); "
                      "TensorFlow writes bundles uncompressed")
  n_restarts = int.from_bytes(contents[-4:], "little")
  end = len(contents) - 4 * (n_restarts + 1)  # the entries, before the restart points
  pos = 0
  key = b""
  out = []
  while pos < end:
    shared, pos = _varint(contents, pos)
    unshared, pos = _varint(contents, pos)
    n, pos = _varint(contents, pos)
    key = key[:shared] + contents[pos:pos + unshared]
    pos += unshared
    out.append((key, contents[pos:pos + n]))
    pos += n
  return out


def _index_file(prefix: str) -> str:
  return prefix if prefix.endswith(".index") else prefix + ".index"


def read_index(prefix: str | os.PathLike) -> tuple[int, dict[str, Entry]]:
  """(number of data shards, {tensor name: Entry}) of the bundle `prefix` (`.../variables/variables`, or its
  `.index` file); every block's crc32c checked."""
  path = _index_file(os.fspath(prefix))
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    raise BundleError(f"{path}: not found") from None
  if len(data) < _FOOTER or int.from_bytes(data[-8:], "little") != _MAGIC:
    raise BundleError(f"{path}: not a TensorFlow checkpoint index (no table footer)")
  entries: dict[str, Entry] = {}
  header = None
  try:
    footer = data[-_FOOTER:]
    _, pos = _varint(footer, 0)  # the metaindex handle (an empty block in bundles)
    _, pos = _varint(footer, pos)
    for _, handle in _block(data, footer[pos:], path):
      for key, value in _block(data, handle, path):
        if key == b"":
          header = dict(_fields(value))
        else:
          entries[key.decode("utf-8")] = _entry(value)
  except (ValueError, IndexError, UnicodeDecodeError) as e:
    if isinstance(e, BundleError):
      raise
    raise BundleError(f"{path}: malformed index ({e})") from None
  if header is None:
    raise BundleError(f"{path}: no BundleHeaderProto (not a tensor bundle)")
  if header.get(2, 0) != 0:
    raise BundleError(f"{path}: written big-endian; only little-endian bundles are read")
  n_shards = header.get(1, 1)
  if not isinstance(n_shards, int) or not 1 <= n_shards < 1 << 20:
    raise BundleError(f"{path}: its header names {str(n_shards)[:20]} data shards")
  for name, entry in entries.items():
    if entry.sliced:
      raise BundleError(f"{path}: tensor '{name}' is saved in slices (a partitioned variable); not supported")
    if entry.shard_id >= n_shards:
      raise BundleError(f"{path}: tensor '{name}' names shard {entry.shard_id} of {n_shards}")
    problem = _entry_problem(entry)
    if problem is not None:
      raise BundleError(f"{path}: tensor '{name}' {problem}")
  return n_shards, entries


def data_file(prefix: str | os.PathLike, shard: int, n_shards: int) -> str:
  """`PREFIX.data-00000-of-00001`: TensorFlow's name of a data shard."""
  return f"{os.fspath(prefix).removesuffix('.index')}.data-{shard:05d}-of-{n_shards:05d}"


def _strings(raw: bytes, entry: Entry) -> tuple[np.ndarray, int]:
  """A string tensor's elements (object array of bytes) and its crc32c as `WriteStringTensor` computes it:
  over the lengths as uint32 (not their varint bytes), the masked length checksum, then the strings."""
  count = int(np.prod(entry.shape, dtype=np.int64))
  lengths = []
  pos = 0
  crc = 0
  for _ in range(count):
    n, pos = _varint(raw, pos)
    lengths.append(n)
    crc = crc32c(struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n), crc)
  if int.from_bytes(raw[pos:pos + 4], "little") != mask(crc):
    raise ValueError("its string lengths fail their crc32c")
  crc = crc32c(raw[pos:pos + 4], crc)
  pos += 4
  out = np.empty(count, dtype=object)
  for i, n in enumerate(lengths):
    out[i] = raw[pos:pos + n]
    pos += n
    crc = crc32c(out[i], crc)
  if pos != len(raw):
    raise ValueError(f"{len(raw)} bytes, the strings need {pos}")
  return out.reshape(entry.shape), crc


def _decode(raw: bytes, entry: Entry, name: str, where: str) -> np.ndarray:
  """The tensor of an entry's bytes, checked against the entry's crc32c."""
  if entry.dtype == _DT_STRING:
    value, crc = _strings(raw, entry)
  elif entry.dtype in _DTYPES:
    dtype = np.dtype(_DTYPES[entry.dtype]).newbyteorder("<")
    count = int(np.prod(entry.shape, dtype=np.int64))
    if len(raw) != count * dtype.itemsize:
      raise ValueError(f"{len(raw)} bytes; shape {list(entry.shape)} of {dtype.name} needs {count * dtype.itemsize}")
    value = np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="), copy=True).reshape(entry.shape)
    crc = None  # the bytes' own, taken below
  else:
    raise BundleError(f"{where}: tensor '{name}' has TensorFlow dtype {entry.dtype}, which is not read here")
  if mask(crc32c(raw) if crc is None else crc) != entry.crc32c:
    raise BundleError(f"{where}: tensor '{name}' fails its crc32c (the file is corrupt)")
  return value


def read_tensors(prefix: str | os.PathLike, names=None) -> dict[str, np.ndarray]:
  """{name: array} of the bundle `prefix` (all tensors, or those of `names`); each tensor's crc32c checked.

  Strings come back as an object array of bytes. Raises BundleError (one line) for a missing file, a name
  the bundle lacks, a short data file or a failed checksum.
  """
  prefix = os.fspath(prefix).removesuffix(".index")
  n_shards, entries = read_index(prefix)
  wanted = list(entries) if names is None else list(names)
  for name in wanted:
    if name not in entries:
      raise BundleError(f"{_index_file(prefix)}: no tensor '{name}'")
  out = {}
  shards = {}  # data file path -> its open file
  try:
    for name in wanted:
      entry = entries[name]
      path = data_file(prefix, entry.shard_id, n_shards)
      if path not in shards:
        try:
          shards[path] = open(path, "rb")
        except FileNotFoundError:
          raise BundleError(f"{path}: not found (the data shard of '{name}')") from None
      f = shards[path]
      if entry.offset + entry.size > os.fstat(f.fileno()).st_size:  # before a byte is read (or allocated)
        raise BundleError(f"{path}: tensor '{name}' runs past the end of the file (bytes {entry.offset:,} to "
                          f"{entry.offset + entry.size:,} of {os.fstat(f.fileno()).st_size:,}; truncated?)")
      f.seek(entry.offset)
      raw = f.read(entry.size)
      if len(raw) != entry.size:
        raise BundleError(f"{path}: tensor '{name}' runs past the end of the file (truncated?)")
      try:
        out[name] = _decode(raw, entry, name, path)
      except ValueError as e:
        if isinstance(e, BundleError):
          raise
        raise BundleError(f"{path}: tensor '{name}' is malformed ({e})") from None
  finally:
    for f in shards.values():
      f.close()
  return out
