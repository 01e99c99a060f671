"""A torch-free writer of state dicts in PyTorch's zip format (what `torch.save` writes since 1.6), which
`torch.load(path)` reads with its default `weights_only=True`, and `torch_pickle.load` reads back.

    torch_save.save({"projection.weight": w, "projection.bias": b}, "token_embedder.pkl")

The archive is torch's layout: `NAME/data.pkl` (a protocol-2 pickle of an `OrderedDict` of tensors, each a
`torch._utils._rebuild_tensor_v2` of a persistent storage id `('storage', torch.FloatStorage, key, 'cpu',
numel)`), one `NAME/data/KEY` file of raw little-endian bytes per tensor, `version`, `byteorder`,
`.format_version`, `.storage_alignment`; entries stored uncompressed, each one's data 64-byte aligned (torch
mmaps them). The pickle is written opcode by opcode (no `pickle.Pickler`: it would import torch to check
the globals) and names only the globals `torch_pickle.ALLOWED` and torch's weights-only unpickler accept.
The file appears whole (a temp file, then a rename).
"""
from __future__ import annotations

import hashlib
import os
import struct
import zipfile
from typing import Mapping

import numpy as np

from elmo_jax.runtime import files

# numpy dtype -> torch storage class (torch/storage.py's legacy names, which weights_only accepts)
STORAGES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float64): "DoubleStorage",
            np.dtype(np.float16): "HalfStorage", np.dtype(np.int64): "LongStorage",
            np.dtype(np.int32): "IntStorage", np.dtype(np.int16): "ShortStorage",
            np.dtype(np.int8): "CharStorage", np.dtype(np.uint8): "ByteStorage", np.dtype(np.bool_): "BoolStorage"}
ALIGNMENT = 64


class _Pickle:
  """Pickle opcodes (protocol 2) appended to a bytearray: only what a state dict needs."""

  def __init__(self):
    self.out = bytearray(b"\x80\x02")  # PROTO 2

  def global_(self, module: str, name: str) -> None:
    self.out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"

  def str_(self, text: str) -> None:
    data = text.encode("utf-8")
    self.out += b"X" + struct.pack("<I", len(data)) + data

  def int_(self, value: int) -> None:
    if 0 <= value < 256:
      self.out += b"K" + struct.pack("<B", value)
    elif 0 <= value < 65536:
      self.out += b"M" + struct.pack("<H", value)
    elif -2**31 <= value < 2**31:
      self.out += b"J" + struct.pack("<i", value)
    else:  # LONG1: little-endian two's complement
      data = int(value).to_bytes((int(value).bit_length() + 8) // 8, "little", signed=True)
      self.out += b"\x8a" + struct.pack("<B", len(data)) + data

  def tuple_(self, values) -> None:
    self.out += b"("  # MARK
    for v in values:
      self.int_(v)
    self.out += b"t"  # TUPLE

  def op(self, code: bytes) -> None:
    self.out += code


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
  out, step = [], 1
  for n in reversed(shape):
    out.append(step)
    step *= max(n, 1)
  return tuple(reversed(out))


def state_pickle(state: Mapping[str, np.ndarray]) -> tuple[bytes, list[bytes]]:
  """(data.pkl's bytes, each storage's raw little-endian bytes, in key order "0", "1", ...)."""
  p, storages = _Pickle(), []
  p.global_("collections", "OrderedDict")
  p.op(b")R")  # EMPTY_TUPLE, REDUCE: OrderedDict()
  p.op(b"(")  # MARK for SETITEMS
  for name, value in state.items():
    array = np.asarray(value)
    if array.dtype not in STORAGES:
      raise TypeError(f"{name}: dtype {array.dtype} has no torch storage type here ({sorted(map(str, STORAGES))})")
    key = str(len(storages))
    storages.append(np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())
    p.str_(name)
    p.global_("torch._utils", "_rebuild_tensor_v2")
    p.op(b"((")  # MARK (the rebuild's args), MARK (the persistent id tuple)
    p.str_("storage")
    p.global_("torch", STORAGES[array.dtype])
    p.str_(key)
    p.str_("cpu")
    p.int_(array.size)
    p.op(b"tQ")  # TUPLE, BINPERSID
    p.int_(0)  # storage offset
    p.tuple_(array.shape)
    p.tuple_(_strides(array.shape))
    p.op(b"\x89")  # NEWFALSE: requires_grad
    p.global_("collections", "OrderedDict")
    p.op(b")R")  # backward hooks: OrderedDict()
    p.op(b"tR")  # TUPLE, REDUCE
  p.op(b"u.")  # SETITEMS, STOP
  return bytes(p.out), storages


def _write_aligned(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
  """One stored entry whose data starts at a multiple of ALIGNMENT (torch's 'FB' padding extra field)."""
  info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
  info.compress_type = zipfile.ZIP_STORED
  offset = zf.fp.tell() + 30 + len(name.encode()) + 4  # local header, file name, the extra field's header
  pad = -offset % ALIGNMENT
  info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
  zf.writestr(info, data)


def write_bytes(state: Mapping[str, np.ndarray], archive_name: str = "archive") -> bytes:
  """The zip file's bytes for `state` (deterministic: same arrays, same bytes)."""
  import io
  pickled, storages = state_pickle(state)
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
    entries = [("data.pkl", pickled), (".format_version", b"1"), (".storage_alignment", str(ALIGNMENT).encode()),
               ("byteorder", b"little")]
    entries += [(f"data/{k}", data) for k, data in enumerate(storages)]
    digest = int(hashlib.sha256(pickled + b"".join(storages)).hexdigest()[:32], 16)
    entries += [("version", b"3\n"), (".data/serialization_id", str(digest).zfill(40)[:40].encode())]
    for name, data in entries:
      _write_aligned(zf, f"{archive_name}/{name}", data)
  return buf.getvalue()


def save(state: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
  """Writes `state` (name -> numpy array, in order) to `path` as torch.save would, atomically."""
  path = os.fspath(path)
  stem = os.path.splitext(os.path.basename(path))[0] or "archive"
  data = write_bytes(state, stem if stem.isidentifier() else "archive")
  with files.atomic_path(path) as tmp:
    with open(tmp, "wb") as f:
      f.write(data)
