"""Byte-level fuzzing of the untrusted-file parsers, run by tests/interop/test_fuzz_parsers.py in a child under
a memory limit: hypothesis mutates valid files (flip, set, cut, insert, delete a few bytes) and every mutant
must either load to the same parameters or be refused with the parser's one error class — never another
exception, a hang or a crash (the child's exit) or unbounded memory (its RLIMIT_AS). Where a format has no
checksum over what it holds (a legacy torch.save file's bytes), a mutant may load to other values: counted
as "differs", still required to be a well-formed state dict. Prints one JSON line of counts per target.

    python -c "import parser_fuzz; parser_fuzz.main(CONFIG_JSON)"
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmo_jax.formats import model_folder
from elmo_jax.formats import safetensors
from elmo_jax.formats import tf_bundle
from elmo_jax.formats import tfhub
from elmo_jax.formats import torch_pickle
from elmo_jax.formats import weights
from elmo_jax.sources import archive

_SLOW = 5.0  # seconds one mutant may take (a hang is a failure)


def _ops(n: int):
  pos = st.integers(0, max(n - 1, 0))
  return st.lists(st.one_of(
      st.tuples(st.just("xor"), pos, st.integers(1, 255)),
      st.tuples(st.just("set"), pos, st.sampled_from([0, 1, 0x7F, 0x80, 0xFF])),
      st.tuples(st.just("cut"), pos, st.just(0)),
      st.tuples(st.just("insert"), pos, st.integers(0, 255)),
      st.tuples(st.just("delete"), pos, st.integers(1, 16))), min_size=1, max_size=3)


def mutate(data: bytes, ops) -> bytes:
  out = bytearray(data)
  for op, at, arg in ops:
    at = at % max(len(out), 1)
    if op == "xor" and out:
      out[at] ^= arg
    elif op == "set" and out:
      out[at] = arg
    elif op == "cut":
      del out[at:]
    elif op == "insert":
      out[at:at] = bytes([arg])
    elif op == "delete":
      del out[at:at + arg]
  return bytes(out)


def _same_arrays(a, b) -> bool:
  return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
          and a.tobytes() == b.tobytes())


def _leaves(tree, prefix=""):
  if isinstance(tree, dict):
    for k in sorted(tree):
      yield from _leaves(tree[k], f"{prefix}/{k}")
  else:
    yield prefix, tree


def _same_tree(a, b) -> bool:
  la, lb = list(_leaves(a)), list(_leaves(b))
  return [k for k, _ in la] == [k for k, _ in lb] and all(_same_arrays(np.asarray(x), np.asarray(y))
                                                          for (_, x), (_, y) in zip(la, lb))


class Target:
  """A valid file, how to load it, the errors it may refuse with, and whether a loaded mutant must be the
  same (a checksummed format) or only well-formed."""

  def __init__(self, name, files, load, errors, same_or_refused, work):
    self.name, self.files, self.load, self.errors = name, files, load, errors
    self.same_or_refused, self.work = same_or_refused, work
    self.originals = {f: open(f, "rb").read() for f in files}
    self.want = load()
    self.counts = {"mutants": 0, "refused": 0, "same": 0, "differs": 0, "slowest_s": 0.0}

  def run_one(self, which: str, ops) -> None:
    path = self.files[0] if which == "0" or len(self.files) == 1 else self.files[1]
    for f, data in self.originals.items():
      with open(f, "wb") as out:
        out.write(mutate(data, ops) if f == path else data)
    self.attempt((which, ops))

  def attempt(self, ops) -> None:
    """Loads what the files now hold and counts the outcome (asserting the properties)."""
    t = time.time()
    try:
      got = self.load()
      outcome = "same" if self.same(got) else "differs"
    except self.errors as e:
      assert "\n" not in str(e), f"{self.name}: a refusal of more than one line: {e!r}"
      outcome = "refused"
    took = time.time() - t
    assert took < _SLOW, f"{self.name}: a mutant took {took:.1f} s ({ops})"
    self.counts["slowest_s"] = max(self.counts["slowest_s"], round(took, 3))
    if outcome == "differs":
      assert not self.same_or_refused, f"{self.name}: a mutant loaded to other parameters ({ops})"
      self.check_well_formed(got)
    self.counts["mutants"] += 1
    self.counts[outcome] += 1

  def same(self, got) -> bool:
    return _same_tree(got, self.want)

  def check_well_formed(self, got, depth: int = 0) -> None:
    """What a loaded mutant holds is plain data: containers, numbers, strings and arrays (no stand-in)."""
    assert depth < 1000, "nested past any state dict"
    if isinstance(got, dict):
      for v in got.values():
        self.check_well_formed(v, depth + 1)
    elif isinstance(got, (list, tuple)):
      for v in got:
        self.check_well_formed(v, depth + 1)
    else:
      assert got is None or isinstance(got, (np.ndarray, str, bytes, int, float, bool)), type(got)


def _torch(name: str, path: str, same_or_refused: bool) -> Target:
  return Target(name, [path], lambda: torch_pickle.load(path), (torch_pickle.TorchPickleError,), same_or_refused,
                None)


def _module(folder: str) -> Target:
  prefix = os.path.join(folder, tfhub.VARIABLES)

  def load():
    m = tfhub.load(folder, quiet=True)
    return {"params": m.params, "mix": m.mix, "options": {"x": np.asarray(json.dumps(m.options, sort_keys=True))}}
  return Target("tf bundle (TF-Hub module)", [prefix + ".index", tf_bundle.data_file(prefix, 0, 1)], load,
                (tf_bundle.BundleError, weights.WeightFileError), True, None)


def _archive(name: str, path: str, work: str) -> Target:
  def load():
    problem = archive.verify(path)
    if problem is not None:
      raise archive.ArchiveError(f"{path}: {problem}")
    into = tempfile.mkdtemp(dir=work)
    try:
      archive._unpack(path, into)  # pylint: disable=protected-access
      got = {}
      for top, _, names in os.walk(into):
        for n in names:
          got[os.path.relpath(os.path.join(top, n), into)] = np.frombuffer(
              open(os.path.join(top, n), "rb").read(), np.uint8)
      return got
    finally:
      shutil.rmtree(into, ignore_errors=True)
  return Target(name, [path], load, (archive.ArchiveError,), True, work)


def _folder(folder: str) -> Target:
  """elmo_jax's own folder, its model.safetensors mutated: no checksum over the tensors' bytes, so a mutant of
  them may load other (finite, well-shaped) values; one of its header is refused or loads the same."""
  def load():
    f = model_folder.load(folder)
    return {"params": f.params, "softmax": f.softmax or {}, "mix": f.mix or {}}
  return Target("safetensors model folder", [os.path.join(folder, model_folder.WEIGHTS)], load,
                (weights.WeightFileError,), False, None)


def _run_header_fields(folder: str, examples: int) -> dict:
  """A model.safetensors whose header says other dtypes, shapes and offsets (the tensors' bytes as they were):
  what a crafted header can claim. Every mutant is refused or loads the same."""
  path = os.path.join(folder, model_folder.WEIGHTS)
  original = open(path, "rb").read()
  entries, metadata, start = safetensors.read_header(path)
  header = {name: {"dtype": next(c for c, d in safetensors.DTYPES.items() if d == dtype), "shape": list(shape),
                   "data_offsets": [begin, end]} for name, (dtype, shape, begin, end) in entries.items()}
  target = _folder(folder)
  target.name, target.same_or_refused = "safetensors header fields", True
  big = st.one_of(st.integers(-10, 5000), st.sampled_from([-(1 << 63), 1 << 40, (1 << 64) - 1, 1 << 62]))
  edit = st.fixed_dictionaries({}, optional={
      "dtype": st.sampled_from(["F32", "F16", "F64", "BF16", "I32", "U8", "BOOL", "", 3]),
      "shape": st.lists(st.one_of(st.integers(-2, 300), st.just(1 << 40)), max_size=9),
      "data_offsets": st.lists(big, min_size=0, max_size=3)})

  @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
            suppress_health_check=list(HealthCheck), print_blob=True)
  @given(st.sampled_from(sorted(header)), edit)
  def prop(name, fields):
    raw = json.dumps({"__metadata__": metadata, **header, name: {**header[name], **fields}}).encode()
    with open(path, "wb") as f:
      f.write(len(raw).to_bytes(8, "little") + raw + original[start:])
    target.attempt((name, fields))
  prop()
  with open(path, "wb") as f:
    f.write(original)
  return {"target": target.name, **target.counts}


def _run_fields(folder: str, examples: int) -> dict:
  """A bundle whose index entries say other dtypes, shapes, offsets and sizes, its checksums made valid again
  (bundle_util.write): what a corrupt byte cannot reach past the crc32c, a crafted index can."""
  import bundle_util  # pylint: disable=g-import-not-at-top
  prefix = os.path.join(folder, tfhub.VARIABLES)
  tensors = {k: list(v.ravel()) if v.dtype == object else v for k, v in tf_bundle.read_tensors(prefix).items()}
  target = _module(folder)
  target.name = "tf bundle index fields (re-checksummed)"
  big = st.one_of(st.integers(-10, 5000), st.sampled_from([-(1 << 63), (1 << 40), (1 << 63) - 1, 1 << 62]))
  edit = st.fixed_dictionaries({}, optional={
      "dtype": st.integers(0, 25), "offset": big, "size": big,
      "shape": st.lists(st.one_of(st.integers(-2, 300), st.just(1 << 40)), max_size=5).map(tuple)})

  @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
            suppress_health_check=list(HealthCheck), print_blob=True)
  @given(st.sampled_from(sorted(tensors)), edit)
  def prop(name, fields):
    bundle_util.write(prefix, tensors, {name: fields})
    target.attempt((name, fields))
  prop()
  return {"target": target.name, **target.counts}


def _run_pickle_in_zip(path: str, examples: int) -> dict:
  """A torch zip file whose data.pkl is mutated and the zip written again (its CRCs valid): the unpickler
  behind the zip's checksums."""
  import zipfile  # pylint: disable=g-import-not-at-top
  with zipfile.ZipFile(path) as z:
    members = {i.filename: z.read(i) for i in z.infolist()}
  name = next(n for n in members if n.endswith("data.pkl"))
  target = _torch("torch.save zip, data.pkl (re-zipped)", path, False)

  @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
            suppress_health_check=list(HealthCheck), print_blob=True)
  @given(_ops(len(members[name])))
  def prop(ops):
    with zipfile.ZipFile(path, "w") as z:
      for n, data in members.items():
        z.writestr(n, mutate(data, ops) if n == name else data)
    target.attempt(ops)
  prop()
  return {"target": target.name, **target.counts}


def _run(target: Target, examples: int, sweep: bool) -> dict:
  sizes = [len(d) for d in target.originals.values()]

  @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
            suppress_health_check=list(HealthCheck), print_blob=True)
  @given(st.sampled_from([str(i) for i in range(len(sizes))]), _ops(max(sizes)))
  def prop(which, ops):
    target.run_one(which, ops)
  prop()
  if sweep:  # every single byte of the first file, flipped: deterministic, exhaustive
    for at in range(sizes[0]):
      target.run_one("0", [("xor", at, 0xFF)])
  for f, data in target.originals.items():  # the valid files back, for the next target
    with open(f, "wb") as out:
      out.write(data)
  return {"target": target.name, **target.counts}


def main(config: str) -> None:
  """`config`: JSON {"torch_legacy": path, "torch_zip": path, "module": folder, "tar_gz": path, "zip": path,
  "folder": a safetensors model folder, "work": folder, "examples": N, "sweep": [target keys]} (each optional);
  each target's counts printed as a JSON line."""
  c = json.loads(config)
  targets = {"torch_legacy": lambda: _torch("torch.save legacy", c["torch_legacy"], False),
             "torch_zip": lambda: _torch("torch.save zip", c["torch_zip"], True),
             "module": lambda: _module(c["module"]),
             "tar_gz": lambda: _archive("archive .tar.gz", c["tar_gz"], c["work"]),
             "zip": lambda: _archive("archive .zip", c["zip"], c["work"]),
             "folder": lambda: _folder(c["folder"])}
  for key, make in targets.items():
    if c.get(key):
      print(json.dumps(_run(make(), c["examples"], key in c.get("sweep", ()))))
      sys.stdout.flush()
  if c.get("module"):
    print(json.dumps(_run_fields(c["module"], c["examples"])))
  if c.get("folder"):
    print(json.dumps(_run_header_fields(c["folder"], c["examples"])))
  if c.get("torch_zip"):
    print(json.dumps(_run_pickle_in_zip(c["torch_zip"], c["examples"])))
