"""`config.init_from` by URL or archive: a 404, an HTML page where a model belongs, a cut archive are one line
naming the config field, found in preflight (the source is fetched there) before the workdir is written, under
configs/default.py (the model's shape given) and configs/finetune.py (taken from the source) alike."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile

import pytest

import http_util
import tiny
from elmo_jax.training import init_from, preflight, variant
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT

cache = http_util.cache
FINETUNE = os.path.join(REPO_ROOT, "configs", "finetune.py")
CASES = {  # served name -> what the one line says after `config.init_from=URL: `
    "nope.tar.gz": "HTTP 404 File not found (check the URL)",
    "page.html": "give the URL of an options.json, of a folder (ending in /) holding options.json and weights.hdf5",
    "page.zip": "the downloaded 46 bytes are not a zip or tar archive (an HTML page); not cached",
    "cut.tar.gz": "the downloaded 3000 bytes are not a whole archive (EOFError: ",
    "nope/": "nope/options.json: HTTP 404 File not found",
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  root = tmp_path_factory.mktemp("srv")
  (root / "page.html").write_text("<html><body>Moved, see our page</body></html>\n")
  (root / "page.zip").write_text("<html><body>Moved, see our page</body></html>\n")
  with tarfile.open(root / "m.tar.gz", "w:gz") as t:
    t.add(FIXTURE_OPTIONS, "m/options.json")
    t.add(FIXTURE_WEIGHTS, "m/weights.hdf5")
  (root / "cut.tar.gz").write_bytes((root / "m.tar.gz").read_bytes()[:3000])
  with http_util.serve(http_util.ModelHandler, root, truncate=set()) as (_, base):
    yield base


def _finetune_config():
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("_finetune_cfg", FINETUNE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.mark.parametrize("config_kind", ["default", "finetune"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_url_source_is_one_line_before_the_workdir(tmp_path, cache, served, name, config_kind):
  train = tmp_path / "train.txt"
  train.write_text("the cat sat on the mat .\n" * 40)
  url = f"{served}/{name}"
  config = tiny.train_config(str(train), init_from=url)
  if config_kind == "finetune":
    config = _finetune_config()
    config.init_from, config.data.train_files, config.data.eval_files = url, str(train), ""
  workdir = tmp_path / "run"
  with pytest.raises((init_from.InitFromError, preflight.PreflightError)) as e:
    preflight.check(variant.resolve(config, str(workdir)), str(workdir))
  message = str(e.value)
  assert message.startswith(f"config.init_from={url}: ") and CASES[name] in message, message
  assert "\n" not in message and not workdir.exists()


def test_a_good_archive_url_is_fetched_and_checked_in_preflight(tmp_path, cache, served):
  """The control: the archive is fetched, unpacked and read in preflight (its shape is not the tiny one)."""
  train = tmp_path / "train.txt"
  train.write_text("the cat sat on the mat .\n" * 40)
  config = tiny.train_config(str(train), init_from=f"{served}/m.tar.gz")
  with pytest.raises(preflight.PreflightError, match="model shape differs from config.options"):
    preflight.check(variant.resolve(config, str(tmp_path / "run")), str(tmp_path / "run"))
  assert os.listdir(cache / "archives")  # unpacked once, for the run's load to reuse


@pytest.mark.slow  # two train.py processes
def test_train_py_refuses_a_cut_archive_url_in_one_line_without_a_workdir(tmp_path, cache, served):
  train = tmp_path / "train.txt"
  train.write_text("the cat sat on the mat .\n" * 40)
  url = f"{served}/cut.tar.gz"
  default = tiny.write_train_config(str(tmp_path / "c.py"), str(train), init_from=url)
  for config in ([f"--config={default}"],
                 [f"--config={FINETUNE}", f"--config.init_from={url}", f"--config.data.train_files={train}"]):
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "train.py"), "--workdir=run", *config],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO_ROOT,
                               "ELMO_JAX_CACHE": str(cache)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"train: error: config.init_from={url}: the downloaded "
                                                           "3000 bytes are not a whole archive"), proc.stderr
    assert not (tmp_path / "run").exists()
