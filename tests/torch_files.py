"""torch.save files written without torch, opcode by opcode: valid ones and the hostile ones a reader must
refuse (a stand-in BUILD, a shared-list tree, views outside their storage, bombs), in both layouts; and
`run_limited`, which runs code in a child under a memory (RLIMIT_AS) and time limit."""
from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np

MAGIC, VERSION = 0x1950A86A20F9469CFC6C, 1001
_TYPES = {np.float32: "FloatStorage", np.int32: "IntStorage", np.int64: "LongStorage", np.float16: "HalfStorage"}


class Global:
  """A global by name (`torch._utils._rebuild_tensor_v2`), pickled as a GLOBAL opcode; never imported."""

  def __init__(self, module: str, name: str):
    self.module, self.name = module, name

  def __call__(self):  # pickle's save_reduce wants a callable
    raise AssertionError("a stand-in")


class Reduce:
  """`func(*args)` (then BUILD with `state`, if given), as pickle writes a __reduce__."""

  def __init__(self, func, *args, state=None):
    self.func, self.args, self.state = func, args, state

  def __reduce__(self):
    return (self.func, self.args) + ((self.state,) if self.state is not None else ())


class Storage:
  """A storage: its key, torch type name and element count (the data is passed beside the pickle)."""

  def __init__(self, key: str, kind: str = "FloatStorage", numel: int = 0):
    self.pid = ("storage", Global("torch", kind), key, "cpu", numel)


class _Writer(pickle._Pickler):  # pylint: disable=protected-access
  dispatch = dict(pickle._Pickler.dispatch)  # pylint: disable=protected-access

  def persistent_id(self, obj):
    return obj.pid if isinstance(obj, Storage) else None

  def _global(self, obj):
    self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
  dispatch[Global] = _global


def dumps(obj) -> bytes:
  out = io.BytesIO()
  _Writer(out, protocol=2).dump(obj)
  return out.getvalue()


ORDERED_DICT = Global("collections", "OrderedDict")


def tensor(storage: Storage, offset: int, size, stride):
  return Reduce(Global("torch._utils", "_rebuild_tensor_v2"), storage, offset, tuple(size), tuple(stride), False,
                Reduce(ORDERED_DICT))


def state(arrays: dict[str, np.ndarray]):
  """(the pickled object: an OrderedDict of tensors, {key: raw array}) for `arrays`, each its own storage."""
  items, data = [], {}
  for i, (name, a) in enumerate(arrays.items()):
    s = Storage(str(i), _TYPES[a.dtype.type], a.size)
    strides = tuple(st // a.itemsize for st in a.strides)
    items.append((name, tensor(s, 0, a.shape, strides)))
    data[str(i)] = np.ascontiguousarray(a).ravel()
  return Reduce(ORDERED_DICT, [list(p) for p in items]), data


def legacy(path, obj, data: dict[str, np.ndarray] | None = None, pickle_bytes: bytes | None = None):
  """The legacy layout: magic, version, sys info, the object pickle, the key list, each storage."""
  data = data or {}
  head = b"".join(pickle.dumps(v, protocol=2) for v in (MAGIC, VERSION, {"little_endian": True}))
  body = [head, dumps(obj) if pickle_bytes is None else pickle_bytes, pickle.dumps(list(data), protocol=2)]
  for a in data.values():
    body += [np.int64(a.size).tobytes(), a.tobytes()]
  with open(path, "wb") as f:
    f.write(b"".join(body))
  return str(path)


def zipped(path, obj, data: dict[str, bytes | np.ndarray] | None = None, pickle_bytes: bytes | None = None,
           compression=zipfile.ZIP_STORED):
  """The zip layout: archive/data.pkl, archive/byteorder, archive/data/KEY per storage."""
  with zipfile.ZipFile(path, "w", compression) as z:
    z.writestr("archive/data.pkl", dumps(obj) if pickle_bytes is None else pickle_bytes)
    z.writestr("archive/byteorder", b"little")
    for key, a in (data or {}).items():
      z.writestr(f"archive/data/{key}", a if isinstance(a, bytes) else a.tobytes())
  return str(path)


def run_limited(code: str, memory: int = 768 << 20, timeout: float = 120) -> list[dict]:
  """Runs `code` in a child Python under RLIMIT_AS=`memory`; returns the JSON lines it printed (assert the
  child exits 0: a crash, a MemoryError or a hang fails)."""
  # The limit is set by the child itself: a preexec_fn would fork this (multithreaded, JAX) process in Python.
  code = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))\n" + code
  here = os.path.dirname(os.path.abspath(__file__))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]),
         "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                        check=False)
  assert done.returncode == 0, f"child exit {done.returncode}: {done.stderr[-3000:]}"
  return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


REFUSALS = '''
import json, sys, time
def refusals(load, cases, errors):
  for case, path in cases:
    t = time.time()
    try:
      load(path)
      got = ("loaded", "")
    except errors as e:
      got = (type(e).__name__, str(e))
    print(json.dumps({"case": case, "path": path, "error": got[0], "message": got[1], "seconds": time.time() - t}))
    sys.stdout.flush()
'''
