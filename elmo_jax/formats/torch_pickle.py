"""A torch-free reader of `torch.save` files: tensors as numpy arrays, through an allow-list unpickler.

    state = torch_pickle.load("encoder.pkl")      # {"forward_layer_0.input_linearity.weight": ndarray, ...}

Both formats torch has written: the legacy one (PyTorch <= 1.5, what ELMoForManyLangs' releases hold: a magic
number, a protocol version and system info pickled one after the other, the object pickle, the list of storage
keys, then each storage as an int64 element count and its raw bytes) and the zip one (`archive/data.pkl`
beside one `archive/data/KEY` file per storage). A pickle may name only what a state dict is made of
(`ALLOWED`: OrderedDict, torch's tensor rebuild functions, its storage types); any other global is refused
(`TorchPickleError`, one line) before it is imported or called, so a model file never runs code.

A file is data with bounds (docs/untrusted-models.md):
  * nothing outlives a load: every load gets its own stand-ins for the allowed names, and only the opcodes a
    state dict needs act on objects (BUILD only sets attributes of an OrderedDict this load made; REDUCE
    only calls the allowed functions, with checked arguments; keys are strings or numbers, so no hash of
    a crafted nested key; sets and the copyreg extension registry are refused);
  * allocation is bounded by the file: the pure-Python unpickler's memo is a dict (a memo index of 2^30 is a
    key, not an array of 2^30 slots), a list or dict referenced twice is refused (a tree of shared lists is
    never expanded), zip members are read up to the sizes their tensors need, and all tensors together may hold
    at most `LIMIT_RATIO` times the file's bytes (plus `LIMIT_SLACK`), or the caller's `max_bytes`;
  * every tensor view lies inside its storage, negative strides included, before any byte is touched.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import reprlib
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C  # torch/serialization.py
_PROTOCOL_VERSION = 1001
# All tensors of a file together (and the inflated zip members) may hold this many times the file's bytes:
# torch stores its zip members uncompressed and a state dict's tensors are its storages, so a real file
# needs ~1x; a view or two of one storage fits, a stride-0 tensor of 3*2^30 elements does not.
LIMIT_RATIO = 4
LIMIT_SLACK = 1 << 20
_MAX_RANK = 32

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter")
ALLOWED = frozenset({("collections", "OrderedDict"), *(("torch._utils", n) for n in _REBUILDS),
                     *(("torch", n) for n in _STORAGE_DTYPES)})
_KEY_TYPES = (str, bytes, int)  # what a state dict's (and its _metadata's) keys are; hashed in constant time
_short = reprlib.Repr()  # what an error message quotes of a file's values: a few levels and characters
_short.maxlevel = 2
_short.maxstring = 40
_short.maxother = 40


class TorchPickleError(ValueError):
  """A file that is not a readable torch.save state, or names a global outside `ALLOWED`; one line, with the
  file's path."""


class _StorageType:
  """What a pickle's `torch.FloatStorage` (etc.) stands for here: its numpy dtype (fixed; one per load)."""
  __slots__ = ("name", "dtype")

  def __init__(self, name: str):
    self.name = name
    self.dtype = np.dtype(_STORAGE_DTYPES[name])


class _Storage:
  """One storage of the file: its key and dtype; `data` (flat numpy) once read."""
  __slots__ = ("key", "dtype", "numel", "data")

  def __init__(self, key: str, dtype: np.dtype, numel: int):
    self.key = key
    self.dtype = dtype
    self.numel = numel
    self.data: np.ndarray | None = None


class _Tensor:
  """A tensor whose storage may not be read yet (the legacy format stores the data after the pickle);
  its size and strides are checked ints, its view is checked against the storage once it is read."""
  __slots__ = ("storage", "offset", "size", "stride")

  def __init__(self, storage, offset, size, stride):
    if not isinstance(storage, _Storage):
      raise ValueError(f"a tensor over a {type(storage).__name__}, not a storage")
    if not _ints(size) or not _ints(stride) or type(offset) is not int:
      raise ValueError("a tensor whose offset, size or stride is not made of ints")
    if len(size) != len(stride) or len(size) > _MAX_RANK or offset < 0 or min(size, default=0) < 0:
      raise ValueError(f"a tensor of size {_short.repr(size)}, stride {_short.repr(stride)} at offset {offset}")
    self.storage = storage
    self.offset = offset
    self.size = tuple(size)
    self.stride = tuple(stride)

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.size, dtype=object)) * self.storage.dtype.itemsize

  def array(self) -> np.ndarray:
    """A copy of the view (the arrays outlive the file's buffer); ValueError if it reaches outside."""
    data = self.storage.data
    if data is None:
      raise ValueError(f"storage {self.storage.key} is used but not stored (truncated file)")
    if 0 in self.size:
      return np.zeros(self.size, data.dtype)
    low = self.offset + sum((k - 1) * s for k, s in zip(self.size, self.stride) if s < 0)
    high = self.offset + sum((k - 1) * s for k, s in zip(self.size, self.stride) if s > 0)
    if low < 0 or high >= self.storage.numel:
      raise ValueError(f"a tensor of size {self.size}, stride {self.stride} at offset {self.offset} reaches "
                       f"element {low if low < 0 else high}, outside its storage of {self.storage.numel} elements")
    itemsize = data.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(data[self.offset:], self.size, tuple(s * itemsize for s in self.stride))
    return np.array(view)


def _ints(values) -> bool:
  return isinstance(values, (tuple, list)) and all(type(v) is int for v in values)


def _rebuild_tensor(storage, storage_offset, size, stride, *_):
  return _Tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, *_):
  if not isinstance(data, _Tensor):
    raise ValueError("a parameter that is not a tensor")
  return data


def _ordered_dict(*args):
  """OrderedDict() as torch.save pickles it, or OrderedDict([[k, v], ...]) as Python 2's pickle does."""
  if not args:
    return collections.OrderedDict()
  items, = args
  if not isinstance(items, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 and
                                            isinstance(p[0], _KEY_TYPES) for p in items):
    raise ValueError("an OrderedDict built from something other than a list of (name, value) pairs")
  return collections.OrderedDict(items)


_CALLABLES = {("collections", "OrderedDict"): _ordered_dict,
              ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
              ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
              ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}


def _refuse(what: str):
  def load(self):
    raise pickle.UnpicklingError(f"opcode {what}, which a torch.save file never holds")
  return load


class _Unpickler(pickle._Unpickler):  # pylint: disable=protected-access  (the pure-Python one: its opcodes)
  """Resolves only `ALLOWED` names, to stand-ins made for this load (nothing is imported); storages by
  persistent id; the opcodes that act on objects only as a state dict needs them (module docstring)."""
  dispatch = dict(pickle._Unpickler.dispatch)  # pylint: disable=protected-access

  def __init__(self, file, path: str, storages: dict[str, _Storage]):
    super().__init__(file, encoding="latin1")  # PyTorch 0.4's Python 2 pickles hold byte strings
    self._path = path
    self._storages = storages
    self._globals = {**_CALLABLES, **{("torch", n): _StorageType(n) for n in _STORAGE_DTYPES}}

  def find_class(self, module: str, name: str):
    if (module, name) not in ALLOWED:
      raise TorchPickleError(f"{self._path}: names {_short.repr(module)[1:-1]}.{_short.repr(name)[1:-1]}, which a "
                             "state dict of tensors never needs; refused without running it (a model file must "
                             "not execute code)")
    return self._globals[(module, name)]

  def persistent_load(self, pid):
    if not isinstance(pid, tuple) or len(pid) < 5 or not isinstance(pid[0], (str, bytes)) or pid[0] not in (
        "storage", b"storage"):
      raise TorchPickleError(f"{self._path}: holds a persistent id {_short.repr(pid)} that is not a tensor storage")
    storage_type, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(storage_type, _StorageType):
      raise TorchPickleError(f"{self._path}: a storage of unknown type {_short.repr(storage_type)}")
    if not isinstance(key, str) or type(numel) is not int or numel < 0:
      raise TorchPickleError(f"{self._path}: a storage id {_short.repr(pid)} whose key or size is malformed")
    if len(pid) > 5 and pid[5] is not None:
      raise TorchPickleError(f"{self._path}: holds a storage view (torch < 0.4 layout), which is not supported")
    if key not in self._storages:
      self._storages[key] = _Storage(key, storage_type.dtype, numel)
    storage = self._storages[key]
    if storage.dtype != storage_type.dtype or storage.numel != numel:
      raise TorchPickleError(f"{self._path}: storage {_short.repr(key)} is named with two types or sizes")
    return storage

  def load_reduce(self):
    args = self.stack.pop()
    func = self.stack[-1]
    if not any(func is f for f in _CALLABLES.values()) or not isinstance(args, tuple):
      raise pickle.UnpicklingError(f"REDUCE of {_short.repr(func)}, not one of torch.save's rebuild functions")
    self.stack[-1] = func(*args)
  dispatch[pickle.REDUCE[0]] = load_reduce

  def load_build(self):
    state = self.stack.pop()
    inst = self.stack[-1]
    if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
      state = state[0]
    if type(inst) is not collections.OrderedDict or not isinstance(state, dict) or not all(
        isinstance(k, str) and not k.startswith("__") for k in state):
      raise pickle.UnpicklingError(f"BUILD of {type(inst).__name__} with {_short.repr(state)}: torch.save only "
                                   "sets a state dict's _metadata")
    inst.__dict__.update(state)
  dispatch[pickle.BUILD[0]] = load_build

  def _check_keys(self, items) -> None:
    """`items` alternates keys and values: every key a string or number (hashed in constant time)."""
    if not all(isinstance(k, _KEY_TYPES) for k in items[0::2]):
      raise pickle.UnpicklingError("a dict key that is not a string or number")

  def load_setitem(self):
    value = self.stack.pop()
    self.load_setitems_of([self.stack.pop(), value])
  dispatch[pickle.SETITEM[0]] = load_setitem

  def load_setitems(self):
    self.load_setitems_of(self.pop_mark())
  dispatch[pickle.SETITEMS[0]] = load_setitems

  def load_setitems_of(self, items) -> None:
    self._check_keys(items)
    target = self.stack[-1] if self.stack else None
    if type(target) not in (dict, collections.OrderedDict) or len(items) % 2:
      raise pickle.UnpicklingError(f"SETITEMS on {type(target).__name__}")
    for i in range(0, len(items), 2):
      target[items[i]] = items[i + 1]

  def load_dict(self):
    items = self.pop_mark()
    self._check_keys(items)
    self.append(dict(zip(items[0::2], items[1::2])))
  dispatch[pickle.DICT[0]] = load_dict

  def load_appends(self):
    items = self.pop_mark()
    if not self.stack or type(self.stack[-1]) is not list:
      raise pickle.UnpicklingError("APPENDS on something that is not a list")
    self.stack[-1].extend(items)
  dispatch[pickle.APPENDS[0]] = load_appends

  def load_append(self):
    value = self.stack.pop()
    if not self.stack or type(self.stack[-1]) is not list:
      raise pickle.UnpicklingError("APPEND on something that is not a list")
    self.stack[-1].append(value)
  dispatch[pickle.APPEND[0]] = load_append

  for _op in ("INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4", "EMPTY_SET", "FROZENSET", "ADDITEMS",
              "NEXT_BUFFER", "READONLY_BUFFER"):
    dispatch[getattr(pickle, _op)[0]] = _refuse(_op)
  del _op


def load(path: str | os.PathLike, max_bytes: int | None = None) -> Any:
  """The object a `torch.save` file holds (a state dict: names -> float32/int numpy arrays); one-line
  TorchPickleError for a file it cannot read, that names a global outside `ALLOWED`, or whose tensors would
  hold more than `max_bytes` (default `LIMIT_RATIO` x the file's bytes + `LIMIT_SLACK`)."""
  path = os.fspath(path)
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise TorchPickleError(f"{path}: cannot be read ({e.strerror or e})") from None
  budget = _Allowance(path, LIMIT_RATIO * len(raw) + LIMIT_SLACK if max_bytes is None else max_bytes)
  try:
    # A legacy file starts with a pickle's PROTO opcode; its tensor bytes may hold a zip's end signature.
    if not raw.startswith(b"\x80") and zipfile.is_zipfile(io.BytesIO(raw)):
      obj = _load_zip(raw, path, budget)
    else:
      obj = _load_legacy(raw, path)
    return _resolve(obj, {}, budget, path)
  except TorchPickleError:
    raise
  except RecursionError:
    raise TorchPickleError(f"{path}: nested too deeply to be a state dict") from None
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, LookupError, AttributeError, ArithmeticError,
          zipfile.BadZipFile, RuntimeError, NotImplementedError, struct.error, zlib.error, OSError) as e:
    why = " ".join(str(e).split())[:120]
    raise TorchPickleError(f"{path}: not a readable torch.save file ({type(e).__name__}: {why})") from None


class _Allowance:
  """The bytes a load's tensors and inflated zip members may still take."""

  def __init__(self, path: str, total: int):
    self.path = path
    self.left = total

  def spend(self, n: int, what: str) -> None:
    """Takes `n` bytes; refuses what would exceed the allowance (a bomb, before it is built)."""
    if n > self.left:
      raise TorchPickleError(f"{self.path}: {what} would take {n:,} bytes, more than the {self.left:,} left of its "
                             f"allowance ({LIMIT_RATIO}x the file's size; torch_pickle.load(max_bytes=...))")
    self.left -= n


def _read_member(archive: zipfile.ZipFile, name: str, n: int | None, budget: _Allowance, path: str) -> bytes:
  """A zip member's bytes (its CRC checked), `n` of them if given, refused before inflating past `budget`."""
  info = archive.getinfo(name)
  if n is not None and info.file_size != n:
    raise TorchPickleError(f"{path}: {name} holds {info.file_size:,} bytes, its tensors need {n:,}")
  budget.spend(info.file_size, name)
  with archive.open(info) as f:
    data = f.read(info.file_size + 1)
  if len(data) != info.file_size:
    raise TorchPickleError(f"{path}: {name} inflates to {len(data):,} bytes, its header says {info.file_size:,}")
  return data


def _load_zip(raw: bytes, path: str, budget: _Allowance) -> Any:
  """The zip layout: `archive/data.pkl` beside one `archive/data/KEY` member per storage."""
  with zipfile.ZipFile(io.BytesIO(raw)) as archive:
    names = archive.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pickles) != 1:
      raise TorchPickleError(f"{path}: a zip file without one data.pkl (found {len(pickles)}); not torch.save's")
    prefix = pickles[0][:-len("data.pkl")]
    byteorder = prefix + "byteorder"
    if byteorder in names and _read_member(archive, byteorder, None, budget, path).strip() not in (b"little",):
      raise TorchPickleError(f"{path}: stored big-endian; only little-endian files are read")
    storages: dict[str, _Storage] = {}
    obj = _Unpickler(io.BytesIO(_read_member(archive, pickles[0], None, budget, path)), path, storages).load()
    for key, storage in storages.items():
      member = f"{prefix}data/{key}"
      if member not in names:
        raise TorchPickleError(f"{path}: storage {_short.repr(key)} is used but not stored ({member})")
      data = _read_member(archive, member, storage.numel * storage.dtype.itemsize, budget, path)
      storage.data = _flat(data, storage, path)
  return obj


def _load_legacy(raw: bytes, path: str) -> Any:
  """The legacy layout: magic number, protocol version, system info, the object, its storage keys (each a
  pickle), then each storage as an int64 element count and its bytes."""
  f = io.BytesIO(raw)

  def plain():  # the next of the pickles around the object: plain values, no storage
    return _Unpickler(f, path, {}).load()

  try:
    magic = plain()
  except (pickle.UnpicklingError, EOFError, ValueError):
    raise TorchPickleError(f"{path}: neither a zip nor a legacy torch.save file") from None
  if type(magic) is not int or magic != _MAGIC_NUMBER:
    raise TorchPickleError(f"{path}: does not start with torch.save's magic number (not a torch file, or the "
                           "pre-0.4 tar layout, which is not supported)")
  version = plain()
  if type(version) is not int or version != _PROTOCOL_VERSION:
    raise TorchPickleError(f"{path}: torch.save protocol version is not {_PROTOCOL_VERSION}")
  sys_info = plain()
  if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
    raise TorchPickleError(f"{path}: stored big-endian; only little-endian files are read")
  storages: dict[str, _Storage] = {}
  obj = _Unpickler(f, path, storages).load()
  keys = plain()
  if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
    raise TorchPickleError(f"{path}: its list of storage keys is malformed ({_short.repr(keys)})")
  for key in keys:
    if key not in storages:
      raise TorchPickleError(f"{path}: storage {_short.repr(key)} is listed but no tensor uses it")
    storage = storages[key]
    header = f.read(8)
    if len(header) != 8:
      raise TorchPickleError(f"{path}: ends inside storage {_short.repr(key)} (truncated file)")
    numel = int.from_bytes(header, "little", signed=True)
    if numel != storage.numel:
      raise TorchPickleError(f"{path}: storage {_short.repr(key)} holds {numel} elements, its tensors say "
                             f"{storage.numel}")
    storage.data = _flat(f.read(numel * storage.dtype.itemsize), storage, path)
  missing = [key for key, storage in storages.items() if storage.data is None]
  if missing:
    raise TorchPickleError(f"{path}: storage {_short.repr(missing[0])} is used but not stored (truncated file)")
  return obj


def _flat(data: bytes, storage: _Storage, path: str) -> np.ndarray:
  """A storage's bytes as its flat numpy array (no copy)."""
  if len(data) != storage.numel * storage.dtype.itemsize:
    raise TorchPickleError(f"{path}: storage {_short.repr(storage.key)} holds {len(data)} bytes, expected "
                           f"{storage.numel} x {storage.dtype.itemsize} (truncated file)")
  return np.frombuffer(data, storage.dtype, storage.numel)


def _resolve(obj: Any, done: dict[int, Any], budget: _Allowance, path: str) -> Any:
  """The unpickled object with every tensor as a numpy array (containers rebuilt, their types kept); a
  tensor or tuple met twice is the same object twice (`done`, by id); a list or dict met twice is refused: a
  state dict shares none, and a tree of shared lists would be exponential for whatever walks it next."""
  if id(obj) in done:
    if isinstance(obj, (dict, list)):
      raise TorchPickleError(f"{path}: holds a {type(obj).__name__} that is referenced twice (a shared or "
                             "cyclic structure, which a state dict never holds)")
    return done[id(obj)][1]
  if isinstance(obj, _Tensor):
    budget.spend(obj.nbytes, f"a tensor of size {obj.size}")
    try:
      out = obj.array()
    except ValueError as e:
      raise TorchPickleError(f"{path}: {e}") from None
  elif isinstance(obj, dict):
    out = type(obj)()
    done[id(obj)] = (obj, out)
    for key, value in obj.items():
      out[key] = _resolve(value, done, budget, path)
  elif isinstance(obj, list):
    out = []
    done[id(obj)] = (obj, out)
    out.extend(_resolve(value, done, budget, path) for value in obj)
  elif isinstance(obj, tuple):
    out = tuple(_resolve(value, done, budget, path) for value in obj)
  elif isinstance(obj, (_Storage, _StorageType)) or callable(obj):
    raise TorchPickleError(f"{path}: holds a bare {type(obj).__name__} outside a tensor")
  else:
    return obj
  done[id(obj)] = (obj, out)  # the original kept alive with it: its id is not reused while `done` lives
  return out
