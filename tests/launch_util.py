"""Helpers of the fault-tolerance tests: a tiny config, train.py subprocesses, and ways to compare runs."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np

import tiny

from elmo_jax.runtime import compat
from elmo_jax.training.throughput import FIELDS as THROUGHPUT_FIELDS
from paths import REPO_ROOT, TESTS_DIR
# What differs between identical runs: timings, and the rates and device memory derived from them.
TIMING_FIELDS = ("tokens_per_sec", "elapsed_sec", "data_wait_share", *THROUGHPUT_FIELDS)
# The tests' code generation (tests/conftest.py sets it): opt level 0, XLA:CPU's classic fusion emitters, each
# only where the running XLA knows it (XLA aborts on an unknown flag; the classic emitters are gone after jaxlib
# 0.10, where the MLIR ones are the only ones): runtime/compat asks jaxlib once per version, cached in .cache/tests.
OPT_LEVEL_0 = "--xla_backend_optimization_level=0"
CLASSIC_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
TEST_CODEGEN_FLAGS = compat.known_xla_flags(
    (OPT_LEVEL_0, CLASSIC_EMITTERS),
    os.environ.get("ELMO_JAX_CACHE") or os.path.join(REPO_ROOT, ".cache", "tests"))


WORDS = ("the cat sat on a mat dog ran far away under big small red tree house river boat sun "
         "moon star hill road town").split()


def write_corpus(path: str, n_lines: int = 300, seed: int = 0, words=WORDS) -> str:
  rng = random.Random(seed)
  with open(path, "w") as f:
    for _ in range(n_lines):
      f.write(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n")
  return path


def write_config(path: str, train_file: str, **overrides) -> str:
  """The tiny config of these tests (tests/tiny.py, no eval set, full softmax) as a file for train.py."""
  settings = {"options.char_cnn.n_highway": 1, "data.vocab_max_size": 500, "eval_every_steps": 10_000,
              "n_negative_samples": 0, **overrides}
  return tiny.write_train_config(path, train_file, **settings)


def env(devices: int = 1, signal_at: str | None = None) -> dict[str, str]:
  """The child's environment; `signal_at="N:KILL"` / `"N:TERM"`: the run signals itself after step N.

  The child inherits the tests' compilation cache (tests/conftest.py sets JAX_COMPILATION_CACHE_DIR): every
  launch of a shape after the first reuses the compiled steps, the same executables, so the same bits."""
  e = dict(os.environ)
  e.pop("ELMO_JAX_TEST_SIGNAL_AT_STEP", None)
  if signal_at:
    e["ELMO_JAX_TEST_SIGNAL_AT_STEP"] = signal_at
  e["XLA_FLAGS"] = xla_flags(devices)
  e["JAX_PLATFORMS"] = "cpu"
  e["PYTHONPATH"] = REPO_ROOT + os.pathsep + e.get("PYTHONPATH", "")
  return e


def xla_flags(devices: int | None, product_emitters: bool = False) -> str:
  """The tests' XLA_FLAGS (tests/conftest.py: the compile options) with `devices` simulated CPU devices; None:
  no device count (a command that sets its own, as `elmo_jax.plan --target=cpu:N`). `product_emitters`: without
  the tests' classic fusion emitters (a program whose compiled form is what is checked, as the planner's loops)."""
  base = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
  if product_emitters:
    base = base.replace(CLASSIC_EMITTERS, "")
  return " ".join((*base.split(), *([f"--xla_force_host_platform_device_count={devices}"] if devices else [])))


def rerun_under_product_codegen(request) -> bool:
  """For a check that two programs give the same bits under the product's code generation: when this process
  compiles with the tests' classic fusion emitters (TEST_CODEGEN_FLAGS), reruns the calling test
  in a child pytest with the product's MLIR emitters, asserts it passed and returns True (the caller returns);
  in that child (or with ELMO_JAX_TEST_FULL_OPT=1) returns False and the test runs here."""
  if CLASSIC_EMITTERS not in os.environ.get("XLA_FLAGS", "").split():
    return False
  e = {**os.environ, "XLA_FLAGS": xla_flags(None, product_emitters=True), "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                         request.node.nodeid], cwd=REPO_ROOT, env=e, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
  return True


def launch(workdir: str, config: str, *flags: str, log: str, **env_kw) -> subprocess.Popen:
  """train.py in a subprocess; with `signal_at`, its test wrapper `tests/signal_train.py`."""
  out = open(log, "ab")
  script = os.path.join(TESTS_DIR, "signal_train.py") if env_kw.get("signal_at") else os.path.join(REPO_ROOT, "train.py")
  return subprocess.Popen([sys.executable, script, f"--workdir={workdir}",
                           f"--config={config}", *flags], cwd=REPO_ROOT, env=env(**env_kw), stdout=out, stderr=subprocess.STDOUT)


def wait(procs, timeout: float = 150.0) -> list[int]:
  deadline = time.time() + timeout
  codes = []
  for p in procs:
    try:
      codes.append(p.wait(max(deadline - time.time(), 1)))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  return codes


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def records(workdir: str, drop=TIMING_FIELDS) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return parse_records(f.read(), drop)


def parse_records(text: str, drop=TIMING_FIELDS) -> list[dict]:
  """metrics.jsonl's records without the fields that differ between identical runs (timings)."""
  return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in text.splitlines()]


def max_step(workdir: str) -> int:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    steps = [json.loads(line)["step"] for line in f if line.endswith("\n")]
  return max(steps, default=0)


def exported(workdir: str) -> dict[str, np.ndarray]:
  out = {}
  with h5py.File(os.path.join(workdir, "export", "weights.hdf5"), "r") as f:
    f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
  return out


def read(path: str) -> str:
  with open(path, errors="replace") as f:
    return f.read()


def popen_interruptible(cmd, **kwargs) -> subprocess.Popen:
  """`subprocess.Popen(cmd, **kwargs)` whose child takes Ctrl-C (SIGINT) as a KeyboardInterrupt, also when the
  suite runs in the background (`cmd &`): such a suite inherits an ignored SIGINT, which a child keeps across
  exec (then Python installs no KeyboardInterrupt); a handled one is reset to the default: give the child that."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    return subprocess.Popen(cmd, **kwargs)
  finally:
    signal.signal(signal.SIGINT, previous)


# A child's script: `python -c DUMP_CHECKPOINT_PARAMS WORKDIR,STEP,OUT.npz ...` writes each checkpoint's params, by
# their `keystr` paths, where the checkpoints were written (a test's 8-device environment reads them as saved).
DUMP_CHECKPOINT_PARAMS = """
import sys, numpy as np, jax
from elmo_jax.training import init_from
for spec in sys.argv[1:]:
  workdir, step, out = spec.split(",")
  params, _, _ = init_from._restore_params(workdir + "/checkpoints", int(step))
  np.savez(out, **{jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)})
"""


def flat_params(params) -> dict:
  """{keystr path: numpy array} of a params tree (what DUMP_CHECKPOINT_PARAMS writes)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(params)}
