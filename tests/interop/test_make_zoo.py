"""scripts/make_zoo.sh against a local file:// mirror of every released model's layout (AllenNLP's four, the
TF-Hub module's archive, an NLPL zip, an ELMoForManyLangs archive where torch is installed): each becomes a
safetensors folder that loads to the source's bits, with a card that says the layers did not move."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

import efml_util
from elmo_jax.sources import loaded
from elmo_jax.sources import pretrained
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT, TFHUB_MODULE


def _mirror(root) -> dict[str, str]:
  """The mirror's files and the environment that points make_zoo.sh at them."""
  for m in pretrained.MODELS.values():
    (root / m.key).mkdir(parents=True)
    shutil.copy(FIXTURE_OPTIONS, root / m.key / f"elmo_{m.key}_options.json")
    shutil.copy(FIXTURE_WEIGHTS, root / m.key / f"elmo_{m.key}_weights.hdf5")
  with tarfile.open(root / "3.tar.gz", "w:gz") as t:  # as TF-Hub serves it: the module's files at the top
    t.add(os.path.join(TFHUB_MODULE, "variables"), "variables")
    t.addfile(tarfile.TarInfo("saved_model.pb"), io.BytesIO(b""))  # the graph, never read
  with zipfile.ZipFile(root / "199.zip", "w") as z:
    z.write(FIXTURE_OPTIONS, "options.json")
    z.write(FIXTURE_WEIGHTS, "model.hdf5")
  env = {"ELMO_JAX_MODELS_URL": f"file://{root}", "ZOO_TFHUB_URL": f"file://{root}/3.tar.gz",
         "ZOO_NLPL_URL": f"file://{root}/199.zip", "ZOO_EFML_URL": ""}
  try:
    efml_util.write_model(str(root / "efml" / "zhs.model"), zip_format=True, seed=1)
  except ImportError:  # torch / elmoformanylangs not installed: the EFML model is left out
    return env
  with tarfile.open(root / "zhs.model.tar.gz", "w:gz") as t:
    t.add(root / "efml" / "zhs.model", "zhs.model")
  return {**env, "ZOO_EFML_URL": f"file://{root}/zhs.model.tar.gz"}


@pytest.mark.slow  # seven conversions, each its own process
def test_make_zoo_converts_every_released_model_from_a_mirror(tmp_path):
  env = {**os.environ, **_mirror(tmp_path / "mirror"), "PYTHON": sys.executable, "PYTHONPATH": REPO_ROOT,
         "ELMO_JAX_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
  out = tmp_path / "zoo"
  done = subprocess.run(["bash", "scripts/make_zoo.sh", str(out)], cwd=REPO_ROOT, env=env, capture_output=True,
                        text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  want = [*pretrained.MODELS, "tfhub-elmo-3", "nlpl-199"] + (["efml-zhs"] if env["ZOO_EFML_URL"] else [])
  assert sorted(os.listdir(out)) == sorted(want), done.stderr[-2000:]
  for name in want:
    folder = str(out / name)
    assert {"config.json", "model.safetensors", "README.md"} <= set(os.listdir(folder)), name
    assert "max |difference| 0 over every layer" in open(os.path.join(folder, "README.md")).read(), name
    assert loaded.load_model(pretrained.resolve_model(folder)).format == "safetensors"
  (tmp_path / "sentences.txt").write_text("The bank flooded .\n")  # the docs' embed of a converted folder
  embed = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--model={out / 'small'}",
                          f"--input_file={tmp_path / 'sentences.txt'}", f"--output_file={tmp_path / 'out.hdf5'}"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert embed.returncode == 0 and os.path.getsize(tmp_path / "out.hdf5") > 0, embed.stderr[-2000:]
  again = subprocess.run(["bash", "scripts/make_zoo.sh", str(out)], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
  assert again.returncode == 0 and again.stderr.count(", kept") == len(want), again.stderr[-2000:]
  usage = subprocess.run(["bash", "scripts/make_zoo.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
  assert usage.returncode == 2 and usage.stderr.startswith("usage: ")
