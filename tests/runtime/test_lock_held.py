"""The test-only packages (requirements-test.txt: reference implementations, the docs toolchain, the server's
clients) leave the lock as pinned: a test dependency that downgraded, say, the ml_dtypes jax runs on would test
a stack no user has."""
from __future__ import annotations

import importlib.metadata
import os
import re
import sys

import pytest
from paths import REPO_ROOT

LOCKS = {".venv": "requirements.txt", ".venv-py312": "requirements-py312.txt"}


def test_every_lock_pin_is_what_is_installed():
  venv = os.path.basename(os.path.realpath(sys.prefix))
  if venv not in LOCKS or os.path.dirname(os.path.realpath(sys.prefix)) != os.path.realpath(REPO_ROOT):
    pytest.skip("not the venv scripts/test.sh makes (another environment holds what its owner installed)")
  with open(os.path.join(REPO_ROOT, LOCKS[venv]), encoding="utf-8") as f:
    pins = dict(line.split("#")[0].strip().split("==") for line in f if "==" in line.split("#")[0])
  moved = {}
  for name, want in pins.items():
    try:
      have = importlib.metadata.version(re.sub(r"\[.*\]", "", name))
    except importlib.metadata.PackageNotFoundError:
      have = None
    if have != want:
      moved[name] = (want, have)
  assert moved == {}, f"{LOCKS[venv]} pins vs installed: {moved}"
