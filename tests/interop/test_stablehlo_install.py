"""StableHLO's one dependency outside jax (`flatbuffers`, jax.export's serialization) is declared (pyproject's
dependencies and both locks: tests/runtime/test_stack.py checks the pins), and without it `convert
--format=stablehlo` and `load_exported` are one line, not an ImportError traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from elmo_jax.formats import stablehlo
from launch_util import env
from paths import FIXTURE_OPTIONS, REPO_ROOT


def test_without_flatbuffers_load_exported_is_one_line(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "flatbuffers", None)  # an import of it fails, as where it is not installed
  with pytest.raises(stablehlo.ExportedError, match="need the flatbuffers package") as e:
    stablehlo.load_exported(tmp_path)
  assert "\n" not in str(e.value)


def test_without_flatbuffers_convert_is_one_line(tmp_path):
  code = ("import sys; sys.modules['flatbuffers'] = None\n"
          "from elmo_jax.cli import main\n"
          f"main(['elmo-jax', 'convert', '--format=stablehlo', '--from={FIXTURE_OPTIONS}', '--to={tmp_path}/out'])")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env(1), capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith("error: StableHLO artifacts need the flatbuffers"), proc.stderr


def test_flatbuffers_is_a_declared_dependency():
  import tomllib  # pylint: disable=g-import-not-at-top
  with open(f"{REPO_ROOT}/pyproject.toml", "rb") as f:
    assert any(d.startswith("flatbuffers") for d in tomllib.load(f)["project"]["dependencies"])
  for lock in ("requirements.txt", "requirements-py312.txt"):
    with open(f"{REPO_ROOT}/{lock}") as f:
      assert any(line.startswith("flatbuffers==") for line in f), lock
