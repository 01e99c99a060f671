"""`python -m elmo_jax convert`: round trips through every writable format give the same bits; refusals are
one line and write nothing (an ELMoForManyLangs model, a taken or input folder, an unknown format)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import h5py
import pytest

from elmo_jax.formats import options as options_lib
from elmo_jax.runtime import files
from elmo_jax.sources import convert

import fixture_models
import launch_util
from paths import REPO_ROOT, TFHUB_BILM, TFHUB_MODULE


def _datasets(path) -> dict[str, tuple[str, tuple, bytes]]:
  out = {}
  with h5py.File(path, "r") as f:
    f.visititems(lambda n, o: out.__setitem__(n, (o.dtype.str, o.shape, o[...].tobytes()))
                 if isinstance(o, h5py.Dataset) else None)
  return out


def _same_model(a: str, b: str) -> None:
  """Two bilm-hdf5 folders hold the same options and every dataset with the same dtype, shape and bits."""
  assert options_lib.load(os.path.join(a, "options.json")) == options_lib.load(os.path.join(b, "options.json"))
  assert _datasets(os.path.join(a, "weights.hdf5")) == _datasets(os.path.join(b, "weights.hdf5"))


def test_round_trips_return_the_same_bits(tmp_path):
  # TF-Hub -> bilm-hdf5: the datasets bilm-tf's own layout holds for the same weights (make_fixture.py)
  convert.convert(TFHUB_MODULE, str(tmp_path / "hub"))
  assert sorted(os.listdir(tmp_path / "hub")) == ["options.json", "weights.hdf5"]
  _same_model(str(tmp_path / "hub"), TFHUB_BILM)
  # bilm-hdf5 -> bilm-hdf5, again: the same bits, the options file byte for byte
  convert.convert(str(tmp_path / "hub"), str(tmp_path / "again"))
  _same_model(str(tmp_path / "hub"), str(tmp_path / "again"))
  assert (tmp_path / "hub" / "options.json").read_bytes() == (tmp_path / "again" / "options.json").read_bytes()
  # a model with a softmax and its vocabulary (what a run exports): both go along
  src = tmp_path / "src"
  fixture_models.write_run_like(src)
  convert.convert(str(src), str(tmp_path / "run"))
  _same_model(str(src), str(tmp_path / "run"))
  assert "softmax/W" in _datasets(tmp_path / "run" / "weights.hdf5")
  assert (tmp_path / "run" / "vocab.txt").read_bytes() == (src / "vocab.txt").read_bytes()


def test_refusals_are_one_line_and_write_nothing(tmp_path):
  efml = tmp_path / "zh.model"
  efml.mkdir()
  for name in ("config.json", "char.dic", "word.dic", "encoder.pkl", "token_embedder.pkl"):
    (efml / name).write_text("")
  out = tmp_path / "out"
  with pytest.raises(convert.ConvertError) as e:
    convert.convert(str(efml), str(out))
  assert str(e.value).startswith(f"--format=bilm-hdf5: {efml}: an ELMoForManyLangs model cannot be held in "
                                 "bilm-tf's layout")
  assert "word embedding" in str(e.value) and "export/" in str(e.value) and "\n" not in str(e.value)
  assert not out.exists()
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "notes.txt").write_text("mine")
  with pytest.raises(files.UnsafeOutputError, match=r"already holds notes.txt; give a new or empty folder$"):
    convert.convert(TFHUB_MODULE, str(taken))
  assert os.listdir(taken) == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"
  shutil.copytree(TFHUB_BILM, tmp_path / "bilm")
  with pytest.raises(files.UnsafeOutputError, match="already holds aggregation.json, options.json, weights.hdf5"):
    convert.convert(str(tmp_path / "bilm"), str(tmp_path / "bilm"))  # onto itself
  with pytest.raises(files.UnsafeOutputError, match="is a file, not a directory"):
    convert.convert(str(tmp_path / "bilm"), str(tmp_path / "bilm" / "options.json"))
  assert convert.WRITE_FORMATS[:2] == ("bilm-hdf5", "efml") and {"stablehlo", "onnx"} <= set(convert.WRITE_FORMATS)
  written = ", ".join(convert.WRITE_FORMATS)
  with pytest.raises(convert.ConvertError, match=rf"^--format=npz: the formats written are {written}$"):
    convert.convert(TFHUB_MODULE, str(out), "npz")
  assert not out.exists() and _datasets(tmp_path / "bilm" / "weights.hdf5") == _datasets(
      os.path.join(TFHUB_BILM, "weights.hdf5"))


def test_command(tmp_path):
  def run(*args):
    return subprocess.run([sys.executable, "-m", "elmo_jax", "convert", *args], cwd=REPO_ROOT,
                          env=launch_util.env(1), capture_output=True, text=True, timeout=300)
  proc = run(f"--from={TFHUB_MODULE}", f"--to={tmp_path / 'out'}")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert lines[0].endswith("using elmo/3's cell_clip=3, proj_clip=3, relu, skip connections and 50 characters "
                           "per token")
  assert lines[1].startswith("note: the module's learned mix has no place in bilm-tf's layout")
  assert lines[2] == f"wrote {tmp_path / 'out'}: bilm-hdf5 of {TFHUB_MODULE}"
  _same_model(str(tmp_path / "out"), TFHUB_BILM)
  proc = run(f"--from={TFHUB_MODULE}", f"--to={tmp_path / 'out'}")  # a second time: refused, one line
  assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
      f"error: --to={tmp_path / 'out'} already holds options.json, weights.hdf5; give a new or empty folder")
