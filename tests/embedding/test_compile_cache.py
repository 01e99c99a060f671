"""The persistent compilation cache (embedding/compile_cache.py): a warm cache copied to another path (a
container image's) is used as is, not recompiled (JAX put its GPU autotune folder's path into every key); a
read-only cache is read and not written, said in one line (was one warning per program)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from paths import REPO_ROOT, TESTS_DIR

LOAD = f"""
import sys
sys.path[:0] = [{REPO_ROOT!r}, {TESTS_DIR!r}]
import tiny
from elmo_jax.embedding import compile_cache
if sys.argv[1] == "read-only":  # as a read-only mount answers (root writes through mode bits)
  compile_cache._takes_writes = lambda path: False
from elmo_jax.embedding.embedder import Embedder
Embedder.random(tiny.tiny_options(), seed=0, batch_size=2).embed_sentences([["a", "b"]])
"""


def _load(cache: str, mode: str = "rw") -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}  # not the suite's shared cache
  return subprocess.run([sys.executable, "-c", LOAD, mode], capture_output=True, text=True, timeout=600,
                        env={**env, "ELMO_JAX_CACHE": cache, "JAX_PLATFORMS": "cpu"})


def _entries(cache) -> set[str]:
  return {n for n in os.listdir(cache) if n.endswith("-cache")}


@pytest.mark.slow  # two processes that compile a warm Embedder's programs (~15 s each on 2 cores)
def test_a_warm_cache_copied_to_another_path_is_used_and_a_read_only_one_is_not_written(tmp_path):
  first = _load(str(tmp_path / "a"))
  assert first.returncode == 0, first.stderr[-2000:]
  warm = _entries(tmp_path / "a")
  assert len(warm) > 5
  shutil.copytree(tmp_path / "a", tmp_path / "b")
  copied = _load(str(tmp_path / "b"), "read-only")  # elsewhere, and read-only: every program is found
  assert copied.returncode == 0, copied.stderr[-2000:]
  assert _entries(tmp_path / "b") == warm  # nothing recompiled into it (and nothing written)
  notes = [line for line in copied.stderr.splitlines() if "compilation cache" in line]
  assert notes == [f"note: the compilation cache {tmp_path / 'b'} is read-only: its programs are read, new ones "
                   "are not kept"], copied.stderr


@pytest.mark.slow  # a loading process
def test_a_read_only_cache_gets_no_entries_and_one_line(tmp_path):
  (tmp_path / "c").mkdir()
  proc = _load(str(tmp_path / "c"), "read-only")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert _entries(tmp_path / "c") == set()
  assert [line for line in proc.stderr.splitlines() if "cache" in line.lower()] == [
      f"note: the compilation cache {tmp_path / 'c'} is read-only: its programs are read, new ones are not kept"]
