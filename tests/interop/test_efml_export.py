"""EFML folders written without torch (`efml_export`, `torch_save`): PyTorch's zip format that torch.load reads
with weights_only=True, the same bits through EFML -> elmo_jax -> EFML, EFML's own Embedder loads the result;
formats that cannot hold a model are refused in one line, writing nothing."""
from __future__ import annotations

import collections
import os

import numpy as np
import pytest

import efml_util
from elmo_jax.formats import efml
from elmo_jax.formats import torch_pickle
from elmo_jax.formats import torch_save
from elmo_jax.sources import convert
from paths import TFHUB_MODULE

PIP = "pip install -r requirements-test.txt (torch, elmoformanylangs)"


@pytest.fixture(scope="module")
def legacy_folder(tmp_path_factory):
  """A tiny EFML model written by EFML's own code in its legacy (PyTorch <= 1.5) format."""
  pytest.importorskip("torch", reason=PIP)
  pytest.importorskip("elmoformanylangs", reason=PIP)
  folder = str(tmp_path_factory.mktemp("efml") / "legacy")
  efml_util.write_model(folder, zip_format=False, seed=3)
  return folder


def test_zip_format_round_trips_bit_for_bit(tmp_path):
  """Every dtype torch_save knows, odd shapes and a 0-d tensor: torch.load(weights_only=True) and torch_pickle
  read back the same bits, dtype and shape; the same state writes the same bytes; entries are 64-byte aligned."""
  torch = pytest.importorskip("torch", reason=PIP)
  rng = np.random.default_rng(0)
  state = collections.OrderedDict(
      w=rng.standard_normal((4, 3)).astype(np.float32), nan=np.array([np.nan, -0.0, np.inf], np.float32),
      half=rng.standard_normal(7).astype(np.float16), d=rng.standard_normal((2, 2, 2)),
      ids=np.arange(-3, 9, dtype=np.int64).reshape(3, 4), small=np.arange(5, dtype=np.int32),
      flags=np.array([True, False]), scalar=np.float32(2.5) * np.ones((), np.float32),
      empty=np.zeros((0, 3), np.float32), big=np.arange(70_000, dtype=np.float32))
  path = tmp_path / "state.pkl"
  torch_save.save(state, path)
  loaded = torch.load(path, weights_only=True)
  assert isinstance(loaded, collections.OrderedDict) and list(loaded) == list(state)
  ours = torch_pickle.load(path)
  for k, v in state.items():
    for got in (loaded[k].numpy(), ours[k]):
      assert got.dtype == v.dtype and got.shape == v.shape, k
      assert got.tobytes() == np.ascontiguousarray(v).tobytes(), k
  assert torch_save.write_bytes(state) == torch_save.write_bytes(state)
  assert torch.load(path, weights_only=True, mmap=True)["big"].numpy().tobytes() == state["big"].tobytes()
  with pytest.raises(TypeError, match="complex64"):
    torch_save.save({"c": np.zeros(2, np.complex64)}, tmp_path / "bad.pkl")
  assert not (tmp_path / "bad.pkl").exists()


@pytest.mark.slow
def test_efml_round_trip_same_bits_and_loads_in_efml(legacy_folder, tmp_path):
  """EFML (legacy) -> elmo_jax -> EFML: every tensor with the same key order, dtype, shape and bits as EFML's
  Model saved it; the dics byte for byte; EFML's Embedder reads the folder and gives our layers within 1e-5."""
  import torch  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "again")
  model = convert.convert(legacy_folder, out, "efml")
  assert model.format == "efml"
  assert sorted(os.listdir(out)) == ["char.dic", "config.json", "encoder.pkl", "tiny.json", "token_embedder.pkl",
                                     "word.dic"]
  for name in ("token_embedder.pkl", "encoder.pkl"):
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(2) == b"PK"  # the zip format torch.save writes today
    want, got = torch.load(os.path.join(legacy_folder, name)), torch.load(os.path.join(out, name), weights_only=True)
    assert list(got) == list(want), name
    for k in want:
      assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
      assert got[k].numpy().tobytes() == want[k].numpy().tobytes(), k
  for name in ("char.dic", "word.dic"):
    assert efml.chars.read_dic(os.path.join(out, name)) == efml.chars.read_dic(os.path.join(legacy_folder, name))
  again = str(tmp_path / "third")  # and once more from our own output: the same files
  convert.convert(out, again, "efml")
  for name in os.listdir(out):
    assert open(os.path.join(out, name), "rb").read() == open(os.path.join(again, name), "rb").read(), name
  _same_layers_as_efml(out)


def _same_layers_as_efml(folder: str) -> None:
  from elmoformanylangs import Embedder as EFMLEmbedder  # pylint: disable=g-import-not-at-top
  _, params, token_ids = efml.load(folder)
  want = EFMLEmbedder(folder).sents2elmo(efml_util.SENTENCES, output_layer=-2)
  got = _embed(folder)
  for sentence, g, w in zip(efml_util.SENTENCES, got, want):
    assert g.shape == w.shape == (3, len(sentence), g.shape[-1])
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=0, err_msg=str(sentence))


def _embed(folder: str):
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  return Embedder.from_pretrained(folder).embed_sentences(efml_util.SENTENCES)


def test_formats_that_cannot_hold_the_model_are_refused(legacy_folder, tmp_path):
  out = tmp_path / "out"
  with pytest.raises(convert.ConvertError) as e:
    convert.convert(legacy_folder, str(out), "bilm-hdf5")
  assert "cannot be held in bilm-tf's layout" in str(e.value) and "--format=efml" in str(e.value)
  assert "\n" not in str(e.value) and not out.exists()
  with pytest.raises(convert.ConvertError) as e:
    convert.convert(TFHUB_MODULE, str(out), "efml")
  assert str(e.value).startswith(f"--format=efml: {TFHUB_MODULE}: a bilm-tf-shaped model")
  assert "\n" not in str(e.value) and not out.exists()


def test_the_convert_command_writes_efml_without_the_bilm_hdf5_note(legacy_folder, tmp_path):
  """`convert --format=efml` printed the note of what bilm-tf's layout cannot hold: nothing of efml's."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from paths import REPO_ROOT  # pylint: disable=g-import-not-at-top
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "convert", f"--from={legacy_folder}",
                         f"--to={tmp_path / 'out'}", "--format=efml"], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [f"wrote {tmp_path / 'out'}: efml of {legacy_folder}"], proc.stderr
