"""Shared fixtures: bilm-tf's fixture model, the tiny model (tests/tiny.py), the tests' compilation cache."""
from __future__ import annotations

import json
import os
import sys

# Compile the tiny test models for speed of compiling: most of the suite's time is compiling programs that then
# run for milliseconds. XLA's backend optimization level 0 (no LLVM optimization passes) and XLA:CPU's classic
# elemental fusion emitters instead of its MLIR ones (a third less compile time per program). The HLO passes
# (fusion, layout, sharding) are the ones the product runs; every tolerance holds unchanged; the few checks that
# a program is bit-identical to another under the product's code generation rerun under it
# (launch_util.rerun_under_product_codegen). Set before JAX creates its CPU client (the flags are read then) and
# inherited by every subprocess (launch_util.xla_flags keeps them when it adds a device count).
# ELMO_JAX_TEST_FULL_OPT=1 compiles as the product does. (Importing JAX, as launch_util does, reads no flag.)
from launch_util import TEST_CODEGEN_FLAGS  # pylint: disable=g-import-not-at-top

if os.environ.get("ELMO_JAX_TEST_FULL_OPT") != "1" and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join((os.environ.get("XLA_FLAGS", ""), *TEST_CODEGEN_FLAGS)).strip()

import h5py
import numpy as np
import pytest
from absl import flags

from elmo_jax.embedding.embedder import enable_compilation_cache
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from paths import FIXTURE_DIR, FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT

# JAX's persistent compilation cache, on from the first test, in the clone's ignored .cache/tests (not
# ~/.cache): a second run of the quick tier skips most compiling; CI's clean clone starts cold. Entries are
# keyed by the compiled program, so a stale entry is never used for changed code.
os.environ.setdefault("ELMO_JAX_CACHE", os.path.join(REPO_ROOT, ".cache", "tests"))
# Every subprocess a test starts (train.py, embed, evaluate, scripts) inherits the same compilation cache
# folder, warm from the first test or child that built a shape: JAX reads these variables at import, and a
# test that points ELMO_JAX_CACHE elsewhere (an empty download cache) still shares the compiled programs.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.environ["ELMO_JAX_CACHE"])
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
enable_compilation_cache()


# elmoformanylangs (the reference the EFML tests compare against) decorates its methods with overrides 3.1's
# @overrides, which reads CPython's bytecode and raises IndexError on Python 3.12's. The decorator only checks
# that a method overrides a base method, so on 3.12+ the tests take it as the identity.
if sys.version_info >= (3, 12):
  try:
    import overrides as _overrides  # pylint: disable=g-import-not-at-top
    _overrides.overrides = lambda method: method
  except ImportError:
    pass


@pytest.fixture(scope="session")
def fixture_options():
  return options_lib.load(FIXTURE_OPTIONS)


@pytest.fixture(scope="session")
def fixture_params(fixture_options):
  return weights_lib.load_hdf5(FIXTURE_WEIGHTS, fixture_options)["params"]


@pytest.fixture(scope="session")
def fixture_sentences():
  """sentences[k][i]: row k of batch i (whitespace tokenized)."""
  with open(os.path.join(FIXTURE_DIR, "lm_embeddings_sentences.json")) as f:
    return [[s.split() for s in row] for row in json.load(f)]


@pytest.fixture(scope="session")
def fixture_expected():
  """expected[k][i]: bilm-tf's top layer [n_tokens, 32] (forward ; backward) of sentences[k][i]."""
  out = []
  for k in range(3):
    with h5py.File(os.path.join(FIXTURE_DIR, f"lm_embeddings_{k}.hdf5"), "r") as f:
      out.append([np.concatenate([f[str(i)][0], f[str(i)][1]], -1) for i in range(10)])
  return out


def command_flags(define_flags, prog: str):
  """Yields a parser of a command's absl flags from given args (defined as the command defines them:
  `define_flags`); unparses and removes them afterwards, so that another command's flags of the same names can
  be defined. For a fixture: `yield from command_flags(embed.define_flags, "embed")`."""
  before = set(flags.FLAGS)
  define_flags()
  added = set(flags.FLAGS) - before

  def parse(*args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS([prog, *args])
  yield parse
  flags.FLAGS.unparse_flags()
  for name in added:
    delattr(flags.FLAGS, name)


@pytest.fixture
def parsed_flags():
  """evaluate.py's flags parsed from the given args (`command_flags`)."""
  from elmo_jax.cli import evaluate  # pylint: disable=g-import-not-at-top
  yield from command_flags(evaluate.define_flags, "evaluate.py")



# Test files whose tests run several processes at once (train.py pods, kill -9 and resume, two-process embeds):
# under xdist they share one worker, so two of them never run together and oversubscribe the cores.
CONCURRENT_PROCESS_FILES = frozenset(f"tests/{name}.py" for name in (
    "training/test_multihost", "training/test_bucket_train", "training/test_domain_finetune",
    "training/test_fault_tolerance", "training/test_stuck_runs", "embedding/test_embed_parallel",
    "embedding/test_embed_job_faults"))


@pytest.hookimpl(optionalhook=True)  # without pytest-xdist (or with -p no:xdist) the suite runs serially
def pytest_xdist_make_scheduler(config, log):
  """`scripts/test.sh` runs `-n 2 --dist=loadscope`: each test file on one worker (its module fixtures, a tiny
  trained run or compiled model, are paid for once), the files of CONCURRENT_PROCESS_FILES all on one.
  (xdist_group markers do not work with pytest 9: xdist 3.8 renames items through an attribute pytest 9 no
  longer reads.)"""
  if config.getvalue("dist") != "loadscope":
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top

  class FileScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
      path = nodeid.split("::", 1)[0]
      return "concurrent-processes" if path in CONCURRENT_PROCESS_FILES else path

  return FileScheduling(config, log)


# An Embedder compiles every shape it can run when it loads (warm=True, the product's default, for a user's
# first call): the suite's many Embedders would each pay for shapes they never run. Off in the suite's
# process; tests/embedding/test_embed_latency.py checks the warm path (no compile after load, the same bits).
from elmo_jax.embedding.embedder import Embedder as _Embedder  # pylint: disable=g-import-not-at-top,g-bad-import-order

_Embedder.__init__.__kwdefaults__["warm"] = False
