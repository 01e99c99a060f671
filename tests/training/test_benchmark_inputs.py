"""benchmarks/efml_finetune.py without its optional inputs (the turkish-treebanks wheel, EFML's package): one
line naming what is missing and how to get it, before anything is written, not a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from paths import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "efml_finetune.py")


def _wheel(path, names):
  with zipfile.ZipFile(path, "w") as z:
    for name in names:
      z.writestr(name, "# sent_id = 1\n# text = Bir\n1\tBir\tbir\tDET\t_\t_\t0\troot\t_\t_\n\n")
  return str(path)


@pytest.mark.parametrize("case,words", [
    ("none", "give --treebank_wheel=WHEEL, the optional turkish-treebanks wheel (pip download --no-deps"),
    ("missing", "not a readable wheel (No such file or directory); pip download"),
    ("not_zip", "not a readable wheel (File is not a zip file)"),
    ("no_wiki", "holds no wiki.conllu; not turkish-treebanks==1.0.0"),
    ("no_efml", "EFML's package elmoformanylangs cannot be imported (No module named 'torch'); pip install it"),
])
def test_efml_finetune_without_its_optional_inputs_is_one_line(tmp_path, case, words):
  fake = tmp_path / "site"  # an elmoformanylangs that fails to import, as it does without torch
  (fake / "elmoformanylangs").mkdir(parents=True)
  (fake / "elmoformanylangs" / "__init__.py").write_text("raise ImportError(\"No module named 'torch'\")\n")
  (tmp_path / "not.whl").write_text("not a zip")
  wheel = {"none": None, "missing": str(tmp_path / "absent.whl"), "not_zip": str(tmp_path / "not.whl"),
           "no_wiki": _wheel(tmp_path / "a.whl", ["tb/web.conllu"]),
           "no_efml": _wheel(tmp_path / "b.whl", ["tb/web.conllu", "tb/wiki.conllu"])}[case]
  root = tmp_path / "root"
  argv = [sys.executable, SCRIPT, f"--root={root}", f"--results={tmp_path / 'out'}"]
  done = subprocess.run(argv + ([f"--treebank_wheel={wheel}"] if wheel else []), capture_output=True, text=True,
                        timeout=120, cwd=tmp_path,
                        env={**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{REPO_ROOT}", "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 1, done.stderr[-2000:]
  assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "Traceback" not in done.stderr, done.stderr
  assert done.stderr.startswith("efml_finetune.py: error: ") and words in done.stderr, done.stderr
  assert not root.exists() and not (tmp_path / "out").exists()  # nothing written
