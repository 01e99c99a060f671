"""The supported stacks (pyproject.toml's ranges, the two locks, scripts/python.sh's choice between them), the XLA
flags the running jaxlib knows (runtime/compat.py) and scripts/device_check.sh's refusals."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement

from elmo_jax.runtime import compat
from paths import REPO_ROOT

LOCKS = ("requirements.txt", "requirements-py312.txt")


def _pins(lock: str) -> dict[str, str]:
  norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
  with open(os.path.join(REPO_ROOT, lock)) as f:
    return {norm(n): v for n, v in (line.strip().split("==") for line in f if "==" in line and line[0] != "#")}


@pytest.mark.parametrize("lock", LOCKS)
def test_each_lock_pins_versions_in_the_declared_ranges(lock):
  with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  pins = _pins(lock)
  for dep in map(Requirement, project["dependencies"]):
    name = re.sub(r"[-_.]+", "-", dep.name).lower()
    assert name in pins and dep.specifier.contains(pins[name]), (lock, str(dep), pins.get(name))
  assert pins["jax"] == pins["jaxlib"], lock


def test_the_two_locks_are_the_two_ends_of_the_jax_range():
  assert _pins("requirements.txt")["jax"] == "0.10.2"  # the last jax for Python 3.11
  assert compat.version_tuple(_pins("requirements-py312.txt")["jax"]) >= (0, 12)
  assert set(_pins("requirements.txt")) == set(_pins("requirements-py312.txt"))  # the same packages, newer


def _bash(script: str, env=None) -> str:
  done = subprocess.run(["bash", "-c", f"source scripts/python.sh; {script}"], cwd=REPO_ROOT, capture_output=True,
                        text=True, env={**os.environ, **(env or {})}, timeout=60)
  assert done.returncode == 0, done.stderr
  return done.stdout.strip()


def test_the_lock_goes_with_the_python():
  want = "requirements.txt .venv" if sys.version_info < (3, 12) else (
      f"requirements-py312.txt .venv-py3{sys.version_info[1]}")
  assert _bash(f'elmo_lock "{sys.executable}"; echo $LOCK $VENV') == want


def test_a_refusing_pyenv_shim_falls_back_to_pyenvs_installed_version(tmp_path):
  """`python3.99` on PATH is a shim that refuses (pyenv's, for a version not selected); pyenv's installed 3.99.x
  is what the scripts use; a name with nothing behind it is reported (status 1), not guessed."""
  shims, root = tmp_path / "shims", tmp_path / "root"
  (root / "versions" / "3.99.1" / "bin").mkdir(parents=True)
  shims.mkdir()
  (shims / "python3.99").write_text("#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n")
  (shims / "pyenv").write_text(f"#!/bin/sh\necho {root}\n")
  for f in shims.iterdir():
    f.chmod(0o755)
  (root / "versions" / "3.99.1" / "bin" / "python3.99").symlink_to(sys.executable)
  env = {"PATH": f"{shims}:/usr/bin:/bin"}
  assert _bash("elmo_python python3.99", env) == str(root / "versions" / "3.99.1" / "bin" / "python3.99")
  assert _bash("elmo_python python3.98 || echo none", env) == "none"


def test_known_xla_flags_asks_jaxlib_once_per_version(tmp_path, monkeypatch):
  asked = []
  monkeypatch.setattr(compat, "_probe", lambda flags: asked.append(flags) or {f: "gone" not in f for f in flags})
  flags = ("--xla_a=0", "--xla_gone=false", "--xla_b=1")
  assert compat.known_xla_flags(flags, str(tmp_path)) == ("--xla_a=0", "--xla_b=1")
  assert compat.known_xla_flags(flags[:2], str(tmp_path)) == ("--xla_a=0",)  # from the file: no second probe
  assert asked == [list(flags)]
  saved = json.loads((tmp_path / compat.XLA_FLAGS_CACHE).read_text())
  assert saved == {f"jaxlib {compat.jaxlib_version()}": {"--xla_a=0": True, "--xla_gone=false": False,
                                                         "--xla_b=1": True}}


@pytest.mark.slow
def test_known_xla_flags_drops_a_flag_xla_does_not_know(tmp_path):
  """A real probe (a child creating a CPU client): XLA would abort every process on the made-up flag."""
  flags = ("--xla_force_host_platform_device_count=2", "--xla_elmo_jax_no_such_flag=true")
  assert compat.known_xla_flags(flags, str(tmp_path)) == flags[:1]


def test_version_tuple():
  assert compat.version_tuple("0.12.0.1") == (0, 12, 0, 1) and compat.version_tuple("0.11.2+cuda13") == (0, 11, 2)
  assert compat.version_tuple("0.12.1.dev20261201") == (0, 12, 1)


@pytest.mark.parametrize("args,message", [((), "--out=DIR"), (("--out=x", "--wheels=/nonexistent"), "device_wheels.sh"),
                                          (("--bogus",), "unknown argument '--bogus'")])
def test_device_check_refuses_in_one_line(args, message):
  done = subprocess.run(["bash", "scripts/device_check.sh", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60)
  assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("minor", [11, 12])
def test_device_wheels_resolves_for_312_whatever_python_runs_it(tmp_path, minor):
  """On Python 3.11 (pip 23.2) the README's `bash scripts/device_wheels.sh` failed: "Package 'jax' requires a
  different Python: 3.11.7 not in '>=3.12'" (pip checked Requires-Python against itself, not --python-version).
  A stand-in PYTHON reports the minor version asked for and records pip's arguments (nothing is fetched)."""
  log = tmp_path / "pip.log"
  fake = tmp_path / "python"
  fake.write_text(f"""#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {log}; exit 0; fi
if [ "$1" = -c ] && [[ "$2" == *version_info* ]] && [[ "$2" != *tomllib* ]]; then
  exec {sys.executable} -c "import sys; sys.version_info = (3, {minor}, 0); $2"; fi
exec {sys.executable} "$@"
""")
  fake.chmod(0o755)
  done = subprocess.run(["bash", "scripts/device_wheels.sh"], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60, env={**os.environ, "PYTHON": str(fake), "ELMO_JAX_WHEELS": str(tmp_path / "w")})
  assert done.returncode == 1 and "pip could not resolve" in done.stderr, done.stderr  # no report: stops there
  resolve = [line for line in log.read_text().splitlines() if " install " in line]
  assert len(resolve) == 1 and "--python-version 3.12" in resolve[0], resolve
  assert ("--ignore-requires-python" in resolve[0]) == (minor != 12), resolve[0]
