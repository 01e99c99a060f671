"""A torch-free reader of `torch.save` files: tensors as numpy arrays, through an allow-list unpickler.

    state = torch_pickle.load("encoder.pkl")      # {"forward_layer_0.input_linearity.weight": ndarray, ...}

Both formats torch has written: the legacy one (PyTorch <= 1.5, what ELMoForManyLangs' releases hold: a magic
number, a protocol version and system info pickled one after the other, the object pickle, the list of storage
keys, then each storage as an int64 element count and its raw bytes) and the zip one (`archive/data.pkl`
beside one `archive/data/KEY` file per storage). A pickle may name only what a state dict is made of
(`ALLOWED`: OrderedDict, torch's tensor rebuild functions, its storage types); any other global is refused
(`TorchPickleError`, one line) before it is imported or called, so a model file never runs code.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from typing import Any

import numpy as np

_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C  # torch/serialization.py
_PROTOCOL_VERSION = 1001

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter")
ALLOWED = frozenset({("collections", "OrderedDict"), *(("torch._utils", n) for n in _REBUILDS),
                     *(("torch", n) for n in _STORAGE_DTYPES)})


class TorchPickleError(ValueError):
  """A file that is not a readable torch.save state, or names a global outside `ALLOWED`; one line, with the
  file's path."""


class _StorageType:
  """What a pickle's `torch.FloatStorage` (etc.) stands for here: its numpy dtype."""

  def __init__(self, name: str):
    self.name, self.dtype = name, np.dtype(_STORAGE_DTYPES[name])


class _Storage:
  """One storage of the file: its key and dtype; `data` (flat numpy) once read."""

  def __init__(self, key: str, dtype: np.dtype, numel: int):
    self.key, self.dtype, self.numel = key, dtype, numel
    self.data: np.ndarray | None = None


class _Tensor:
  """A tensor whose storage may not be read yet (the legacy format stores the data after the pickle)."""

  def __init__(self, storage: _Storage, offset: int, size, stride):
    self.storage, self.offset, self.size, self.stride = storage, int(offset), tuple(size), tuple(stride)

  def array(self) -> np.ndarray:
    data = self.storage.data
    if not self.size:
      return data[self.offset].copy()
    last = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride)) if all(self.size) else self.offset
    if last >= len(data) and all(self.size):
      raise ValueError(f"tensor of size {self.size} runs past its storage ({len(data)} elements)")
    itemsize = data.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(data[self.offset:], self.size, tuple(s * itemsize for s in self.stride))
    return np.array(view)  # a copy: the arrays outlive the file's buffer


def _rebuild_tensor(storage, storage_offset, size, stride, *_):
  return _Tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad, backward_hooks, *_):
  return data


_GLOBALS = {("collections", "OrderedDict"): collections.OrderedDict,
            ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
            **{("torch", n): _StorageType(n) for n in _STORAGE_DTYPES}}


class _Unpickler(pickle.Unpickler):
  """Resolves only `ALLOWED` names, to the stand-ins above (nothing is imported); storages by persistent id."""

  def __init__(self, file, path: str, storages: dict[str, _Storage]):
    super().__init__(file, encoding="latin1")  # PyTorch 0.4's Python 2 pickles hold byte strings
    self._path, self._storages = path, storages

  def find_class(self, module: str, name: str):
    if (module, name) not in ALLOWED:
      raise TorchPickleError(f"{self._path}: names {module}.{name}, which a state dict of tensors never needs; "
                             "refused without running it (a model file must not execute code)")
    return _GLOBALS[(module, name)]

  def persistent_load(self, pid):
    if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage") or len(pid) < 5:
      raise TorchPickleError(f"{self._path}: holds a persistent id {str(pid)[:60]!r} that is not a tensor storage")
    storage_type, key, numel = pid[1], str(pid[2]), int(pid[4])
    if not isinstance(storage_type, _StorageType):
      raise TorchPickleError(f"{self._path}: a storage of unknown type {storage_type!r}")
    if len(pid) > 5 and pid[5] is not None:
      raise TorchPickleError(f"{self._path}: holds a storage view (torch < 0.4 layout), which is not supported")
    if key not in self._storages:
      self._storages[key] = _Storage(key, storage_type.dtype, numel)
    return self._storages[key]


def load(path: str | os.PathLike) -> Any:
  """The object a `torch.save` file holds (a state dict: names -> float32/int numpy arrays); one-line
  TorchPickleError for a file it cannot read or that names a global outside `ALLOWED`."""
  path = os.fspath(path)
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise TorchPickleError(f"{path}: cannot be read ({e.strerror or e})") from None
  try:
    if zipfile.is_zipfile(io.BytesIO(raw)):
      obj, storages = _load_zip(raw, path)
    else:
      obj, storages = _load_legacy(raw, path)
    return _resolve(obj)
  except TorchPickleError:
    raise
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
          zipfile.BadZipFile) as e:
    raise TorchPickleError(f"{path}: not a readable torch.save file ({type(e).__name__}: {str(e)[:80]})") from None


def _load_zip(raw: bytes, path: str) -> tuple[Any, dict[str, _Storage]]:
  with zipfile.ZipFile(io.BytesIO(raw)) as z:
    names = z.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pickles) != 1:
      raise TorchPickleError(f"{path}: a zip file without one data.pkl (found {len(pickles)}); not torch.save's")
    prefix = pickles[0][:-len("data.pkl")]
    byteorder = prefix + "byteorder"
    if byteorder in names and z.read(byteorder).strip() not in (b"little",):
      raise TorchPickleError(f"{path}: stored big-endian; only little-endian files are read")
    storages: dict[str, _Storage] = {}
    obj = _Unpickler(io.BytesIO(z.read(pickles[0])), path, storages).load()
    for key, s in storages.items():
      data = z.read(f"{prefix}data/{key}")
      s.data = _flat(data, s, path)
  return obj, storages


def _load_legacy(raw: bytes, path: str) -> tuple[Any, dict[str, _Storage]]:
  f = io.BytesIO(raw)
  plain = lambda: _Unpickler(f, path, {}).load()  # noqa: E731  (the header pickles hold plain values)
  try:
    magic = plain()
  except (pickle.UnpicklingError, EOFError, ValueError):
    raise TorchPickleError(f"{path}: neither a zip nor a legacy torch.save file") from None
  if magic != _MAGIC_NUMBER:
    raise TorchPickleError(f"{path}: does not start with torch.save's magic number (not a torch file, or the "
                           "pre-0.4 tar layout, which is not supported)")
  if plain() != _PROTOCOL_VERSION:
    raise TorchPickleError(f"{path}: torch.save protocol version is not {_PROTOCOL_VERSION}")
  sys_info = plain()
  if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
    raise TorchPickleError(f"{path}: stored big-endian; only little-endian files are read")
  storages: dict[str, _Storage] = {}
  obj = _Unpickler(f, path, storages).load()
  keys = plain()
  for key in keys:
    key = str(key)
    if key not in storages:
      raise TorchPickleError(f"{path}: storage {key} is listed but no tensor uses it")
    s = storages[key]
    header = f.read(8)
    if len(header) != 8:
      raise TorchPickleError(f"{path}: ends inside storage {key} (truncated file)")
    numel = int.from_bytes(header, "little", signed=True)
    s.data = _flat(f.read(numel * s.dtype.itemsize), s, path, numel)
  missing = [k for k, s in storages.items() if s.data is None]
  if missing:
    raise TorchPickleError(f"{path}: storage {missing[0]} is used but not stored (truncated file)")
  return obj, storages


def _flat(data: bytes, s: _Storage, path: str, numel: int | None = None) -> np.ndarray:
  numel = s.numel if numel is None else numel
  if len(data) != numel * s.dtype.itemsize or numel < s.numel:
    raise TorchPickleError(f"{path}: storage {s.key} holds {len(data)} bytes, expected {s.numel} x "
                           f"{s.dtype.itemsize} (truncated file)")
  return np.frombuffer(data, s.dtype, numel)


def _resolve(obj: Any) -> Any:
  """The unpickled object with every tensor as a numpy array (containers rebuilt, their types kept)."""
  if isinstance(obj, _Tensor):
    return obj.array()
  if isinstance(obj, dict):
    out = type(obj)()
    for k, v in obj.items():
      out[k] = _resolve(v)
    return out
  if isinstance(obj, (list, tuple)):
    return type(obj)(_resolve(v) for v in obj)
  if isinstance(obj, (_Storage, _StorageType)):
    raise TorchPickleError("a bare storage outside a tensor")
  return obj
