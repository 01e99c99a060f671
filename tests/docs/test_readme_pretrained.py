"""The commands a newcomer runs with a released model work as written: the "Embed a file" and "Sentence vectors
in Python" sections of docs/embedding.md, the tagger of docs/flax.md and the README's "Embed a file" and Flax
blocks, every shell command and Python block, with the released names served by a local mirror of the fixture
model (`$ELMO_JAX_MODELS_URL`)."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import h5py
import pytest

from elmo_jax.sources import pretrained
from http_util import mirror, serve_models
from paths import REPO_ROOT

FIXTURE = os.path.join(REPO_ROOT, "tests", "fixtures", "bilm_tf")


def _read(*path: str) -> str:
  with open(os.path.join(REPO_ROOT, *path), encoding="utf-8") as f:
    return f.read()


def _part(text: str, heading: str) -> str:
  """From `heading` to the next heading of its level."""
  start = text.index(heading + "\n")
  end = text.find("\n" + heading.split(" ")[0] + " ", start + 1)
  return text[start:] if end < 0 else text[start:end]


def section() -> str:
  """docs/embedding.md's two sections with a released model, then docs/flax.md."""
  embedding = _read("docs", "embedding.md")
  return (_part(embedding, "## Embed a file") + _part(embedding, "## Sentence vectors in Python") +
          _read("docs", "flax.md"))


def readme_section() -> str:
  text = _read("README.md")
  return _part(text, "## Embed a file") + _part(text, "## ELMo in a Flax task model")


def blocks(kind: str, text: str | None = None) -> list[str]:
  return re.findall(rf"```{kind}\n(.*?)```", section() if text is None else text, re.S)


def _commands(block_list: list[str]) -> list[str]:
  return [c.replace("\\\n", " ") for block in block_list for c in re.split(r"(?<!\\)\n", block) if c]


def runnable(command: str) -> str:
  """A page's `elmo-jax ...` command run with this interpreter (`python -m elmo_jax` is the same command)."""
  return re.sub(r"^elmo-jax ", f"{sys.executable} -m elmo_jax ", command)


def test_section_has_the_three_tasks():
  text = section()
  for heading in ("## Embed a file", "## Sentence vectors in Python", "# ELMo in Flax task models"):
    assert heading in text
  assert len(blocks("python")) == 2 and len(blocks("bash")) == 2
  tagger = blocks("python")[1]
  assert "freeze_bilm" in tagger and "l2_coef" in tagger and "losses" in tagger


@pytest.mark.slow
def test_readme_code_runs(tmp_path):
  with open(os.path.join(FIXTURE, "lm_embeddings_sentences.json")) as f:
    lines = json.load(f)[1][:5]
  (tmp_path / "sentences.txt.gz").write_bytes(gzip.compress("".join(s + "\n" for s in lines).encode()))
  (tmp_path / "raw.txt").write_text("Hello, world!\nIt's raw text.\n")
  (tmp_path / "vocab.txt").write_text("\n".join(sorted({w for s in lines for w in s.split()})) + "\n")
  with serve_models(mirror(tmp_path / "www", tuple(pretrained.MODELS))) as (server, base):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ELMO_JAX_MODELS_URL": base,
           "ELMO_JAX_CACHE": str(tmp_path / "cache"), "PYTHONPATH": REPO_ROOT}
    commands = _commands(blocks("bash"))
    assert len(commands) == 5
    for command in commands:
      command = runnable(command)
      proc = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
      assert proc.returncode == 0, (command, proc.stderr)
    for code in blocks("python"):
      proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
      assert proc.returncode == 0, proc.stderr
      assert proc.stdout.strip(), code
    readme = tmp_path / "readme"  # the README's own blocks, in a folder of their own (the same output names)
    readme.mkdir()
    (readme / "sentences.txt").write_text("".join(s + "\n" for s in lines))
    released = [c for c in _commands(blocks("bash", readme_section())) if "--model=" in c]
    assert len(released) == 1, released  # the --workdir one: tests/training/test_train.py
    for command in released:
      proc = subprocess.run(runnable(command), shell=True, cwd=readme,
                            env=env, capture_output=True, text=True, timeout=300)
      assert proc.returncode == 0, (command, proc.stderr)
    readme_code = blocks("python", readme_section())
    assert len(readme_code) == 2
    for code in readme_code:
      proc = subprocess.run([sys.executable, "-c", code], cwd=readme, env=env, capture_output=True, text=True,
                            timeout=300)
      assert proc.returncode == 0, proc.stderr
    # Only the two files of each model used were fetched, once each.
    assert sorted(set(server.requests)) == sorted(server.requests)
  with h5py.File(tmp_path / "elmo.hdf5", "r") as f:
    assert f["0"].dtype == "float16" and f["0"].shape == (len(lines[0].split()), 32)
  with h5py.File(tmp_path / "vectors.hdf5", "r") as f:
    assert f[lines[0]].shape == (32,)
  with h5py.File(tmp_path / "tokens.hdf5", "r") as f:
    assert f["embedding"].shape[1] == 16
  with h5py.File(tmp_path / "elmo_cached.hdf5", "r") as f, h5py.File(tmp_path / "elmo.hdf5", "r") as g:
    assert abs(f["0"][-1] - g["0"][...]).max() < 2e-3  # the token-cached run agrees with the char path
