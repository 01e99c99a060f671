"""docs/flax-nnx.md runs as written: its Python blocks, one program, with the released name `small` served by a local
mirror of the fixture model (`$ELMO_JAX_MODELS_URL`); the page and the linen page link each other."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from http_util import mirror, serve_models
from paths import REPO_ROOT


def _read(name: str) -> str:
  with open(os.path.join(REPO_ROOT, "docs", name), encoding="utf-8") as f:
    return f.read()


def _python_blocks() -> list[str]:
  return re.findall(r"```python\n(.*?)```", _read("flax-nnx.md"), re.S)


def test_page_shows_the_frozen_and_fine_tuned_loops_and_links_the_linen_page():
  page, code = _read("flax-nnx.md"), "\n".join(_python_blocks())
  assert page.startswith("# ELMo in an NNX task model\n")
  assert "](flax.md)" in page and "](flax-nnx.md)" in _read("flax.md")
  for needed in ("load_elmo_nnx", "wrt=nnx.Param", "wrt=(nnx.Param, BiLMWeight)", "requires_grad=True",
                 "optax.multi_transform", "@nnx.jit", "l2_loss()", "ocp.StandardCheckpointer", "accuracy("):
    assert needed in code, needed
  with open(os.path.join(REPO_ROOT, "mkdocs.yml"), encoding="utf-8") as f:
    nav = f.read()
  assert nav.index("flax.md") < nav.index("flax-nnx.md")


@pytest.mark.slow  # a subprocess training a tagger twice
def test_page_code_runs(tmp_path):
  with serve_models(mirror(tmp_path / "www")) as (server, base):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ELMO_JAX_MODELS_URL": base,
           "ELMO_JAX_CACHE": str(tmp_path / "cache"), "PYTHONPATH": REPO_ROOT}
    done = subprocess.run([sys.executable, "-c", "\n".join(_python_blocks())], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(set(server.requests)) == sorted(server.requests)  # the two files, fetched once each
  printed = done.stdout.splitlines()
  assert [line.split(":")[0] for line in printed] == ["frozen biLM", "fine-tuned biLM"], printed
  assert os.path.isdir(tmp_path / "tagger_checkpoint")
