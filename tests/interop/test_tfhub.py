"""TF-Hub elmo/3-layout modules without TensorFlow: the bundle reader against TensorFlow's own bytes
(tests/fixtures/tfhub, written by make_fixture.py), bit-exact params and outputs against the same weights as
bilm-tf's hdf5, and one-line errors for a corrupt byte or a missing variable."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import h5py

import jax
import numpy as np
import pytest

from elmo_jax.embedding import writer
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.embedding.inputs import EmbedInputError
from elmo_jax.formats import crc32c
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import tf_bundle
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights as weights_lib
from elmo_jax.sources import download
from elmo_jax.sources import pretrained

import launch_util
from paths import REPO_ROOT, TFHUB_BILM, TFHUB_DIR, TFHUB_MODULE

PREFIX = os.path.join(TFHUB_MODULE, tfhub.VARIABLES)


def _leaves(tree):
  return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


def test_crc32c_masked_as_tensorflow(monkeypatch):
  data = bytes(range(256)) * 3
  fast = crc32c.crc32c(data)
  monkeypatch.setattr(crc32c, "_fast", None)  # the pure-Python table, where google-crc32c is missing
  assert crc32c.crc32c(b"123456789") == 0xE3069283  # RFC 3720's check value
  assert crc32c.crc32c(data) == fast == crc32c.crc32c(data[100:], crc32c.crc32c(data[:100]))
  # the numpy lanes (large inputs) agree with the byte-by-byte register, remainder and all
  big = np.random.default_rng(0).integers(0, 256, 64 * 97 + 13, dtype=np.uint8).tobytes()
  assert crc32c._update_lanes(0x1234567, big, lanes=64) == crc32c._update(0x1234567, big)
  # TF's Mask (crc32c.h): rotate right by 15, add 0xa282ead8; undone, it gives the crc back
  rot = (crc32c.mask(0xE3069283) - 0xa282ead8) & 0xFFFFFFFF
  assert ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF == 0xE3069283


def test_bundle_reads_tensorflows_dtypes():
  n_shards, entries = tf_bundle.read_index(PREFIX)
  assert n_shards == 1 and len(entries) == 33  # 31 of elmo/3's names + the int64 and string extras
  assert entries["bilm/CNN/W_cnn_2"].shape == (1, 3, 4, 6) and entries["bilm/CNN/W_cnn_2"].dtype == 1
  tensors = tf_bundle.read_tensors(PREFIX)
  assert tensors["global_step"].dtype == np.int64 and tensors["global_step"] == 12345678901
  assert tensors["module_note"].tolist() == [b"elmo_jax", b"", "tiny \u00e9lmo".encode()]
  assert tensors["aggregation/scaling"].shape == () and tensors["aggregation/scaling"].dtype == np.float32
  assert np.all(tensors["bilm/char_embed"][0] == 0) and tensors["bilm/char_embed"].shape == (262, 4)
  with pytest.raises(tf_bundle.BundleError, match=r"variables.index: no tensor 'nope'$"):
    tf_bundle.read_tensors(PREFIX, ["nope"])


def test_module_params_equal_the_hdf5_bit_for_bit():
  module = tfhub.load(TFHUB_MODULE)
  options = options_lib.load(os.path.join(TFHUB_BILM, "options.json"))
  assert module.options == options
  want = weights_lib.load_hdf5(os.path.join(TFHUB_BILM, "weights.hdf5"), options)["params"]
  got, ref = _leaves(module.params), _leaves(want)
  assert [k for k, _ in got] == [k for k, _ in ref] and len(got) == 29
  for (name, a), (_, b) in zip(got, ref):
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape and a.tobytes() == b.tobytes(), name
  with open(os.path.join(TFHUB_BILM, "aggregation.json")) as f:
    mix = json.load(f)
  assert module.mix["weights"].tolist() == np.float32(mix["weights"]).tolist()
  assert module.mix["scaling"] == np.float32(mix["scaling"])
  assert module.files == (PREFIX + ".index", PREFIX + ".data-00000-of-00001")
  found = pretrained.resolve_model(TFHUB_MODULE)
  assert found.tfhub_dir == TFHUB_MODULE and found.options_file is None
  assert pretrained.load(TFHUB_MODULE)[0] == options
  with pytest.raises(download.DownloadError, match=r"a TF-Hub module has no options.json \+ weights.hdf5; convert "
                     r"it first: elmo-jax convert --from=.*module --to=DIR$"):
    pretrained.resolve(TFHUB_MODULE)  # evaluate.py --model reads the two files


@pytest.fixture(scope="module")
def hub():
  return Embedder.from_pretrained(TFHUB_MODULE, devices=1)


@pytest.fixture(scope="module")
def ref():
  return Embedder.from_pretrained(TFHUB_BILM, devices=1)


def test_embedder_outputs_agree_exactly(hub, ref, capsys):
  tfhub.load(TFHUB_MODULE)
  assert capsys.readouterr().err == f"{TFHUB_MODULE}: {tfhub.ASSUMED}\n"  # what is assumed, in one line
  sentences = [["The", "bank", "flooded", "."], ["a", "über-long-token-" * 5], []]
  assert hub.input_files == list(tfhub.load(TFHUB_MODULE, quiet=True).files)
  layers, ref_layers = hub.embed_sentences(sentences), ref.embed_sentences(sentences)
  for a, b in zip(layers, ref_layers):
    assert a.shape == b.shape and a.tobytes() == b.tobytes()
  outputs = hub.module_outputs(sentences)
  assert ref.module_mix is None and set(ref.module_outputs(sentences[:1])[0]) == set(tfhub.OUTPUTS[:3])
  w = np.exp(hub.module_mix["weights"].astype(np.float64))
  w /= w.sum()
  for out, lay in zip(outputs, layers):
    assert set(out) == set(tfhub.OUTPUTS)
    assert np.array_equal(out["word_emb"], lay[0, :, :4]) and np.array_equal(out["word_emb"], lay[0, :, 4:])
    assert np.array_equal(out["lstm_outputs1"], lay[1]) and np.array_equal(out["lstm_outputs2"], lay[2])
    # the mix, independently in float64: gamma * sum_k softmax(w)_k h_k (float32 rounding: 1e-6)
    mixed = float(hub.module_mix["scaling"]) * np.tensordot(w, lay.astype(np.float64), axes=(0, 0))
    np.testing.assert_allclose(out["elmo"], mixed, rtol=0, atol=1e-6)
    assert out["elmo"].dtype == out["default"].dtype == np.float32 and out["default"].shape == (8,)
    np.testing.assert_allclose(out["default"], mixed.mean(0) if len(lay[0]) else 0.0, rtol=0, atol=1e-6)
  with pytest.raises(ValueError, match="a TF-Hub module's outputs are"):
    tfhub.output(layers[0], "pooled_output", hub.module_mix)


def test_flipped_byte_fails_its_crc32c(tmp_path):
  for name, at, says in (("variables.data-00000-of-00001", 200, r"tensor '[^']+' fails its crc32c"),
                         ("variables.index", 40, r"the block at byte 0 fails its crc32c")):
    folder = tmp_path / name
    shutil.copytree(TFHUB_MODULE, folder)
    path = folder / "variables" / name
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(tf_bundle.BundleError) as e:
      tfhub.load(folder)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(path))
    assert e.match(says + r" \(the file is corrupt\)$")


def test_missing_variable_is_named():
  with pytest.raises(weights_lib.WeightFileError) as e:
    tfhub.load(os.path.join(TFHUB_DIR, "module_missing"))
  assert str(e.value) == (f"{os.path.join(TFHUB_DIR, 'module_missing', tfhub.VARIABLES)}.index: variable "
                          "'bilm/RNN_1/RNN/MultiRNNCell/Cell1/rnn/lstm_cell/projection/kernel' is missing "
                          "(options expect shape (8, 4))")


@pytest.mark.slow
def test_embed_command_writes_the_module_outputs(hub, ref, tmp_path):
  lines = ["The bank flooded .", "a river bank", "bank"]
  text = tmp_path / "in.txt"
  text.write_text("\n".join(lines) + "\n")
  want = hub.module_outputs([line.split() for line in lines])
  out = tmp_path / "elmo.hdf5"

  def embed(*args):  # the command itself, on the module folder
    return subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--model={TFHUB_MODULE}", f"--input_file={text}",
                           f"--output_file={out}", "--noprogress", *args], cwd=REPO_ROOT, env=launch_util.env(1),
                          capture_output=True, text=True, timeout=300)
  proc = embed("--module_output=elmo", "--top")
  assert proc.returncode == 1 and proc.stderr.splitlines() == [
      "elmo_jax embed: error: --module_output=elmo is the output; drop --all/--top/--average/--mix_weights "
      "(--help for usage)"]
  proc = embed("--module_output=elmo")
  assert proc.returncode == 0, proc.stderr
  assert f"{TFHUB_MODULE}: {tfhub.ASSUMED}" in proc.stderr
  for name in ("word_emb", "default"):  # the others in process: the same writer
    writer.embed_file(hub, text, tmp_path / f"{name}.hdf5", output=name, progress_every=None)
  for name in ("elmo", "word_emb", "default"):
    with h5py.File(tmp_path / f"{name}.hdf5", "r") as f:
      for i in range(len(lines)):
        assert f[str(i)].shape == want[i][name].shape and f[str(i)][...].tobytes() == want[i][name].tobytes()
  with pytest.raises(EmbedInputError, match=r"^'elmo' is a TF-Hub module's learned mix of the layers; this "
                     r"model has none \(give the module's folder as the model\)$"):
    writer.embed_file(ref, text, tmp_path / "no.hdf5", output="elmo")


@pytest.mark.parametrize("output", ["elmo", "lstm_outputs1", "default"])
def test_stateful_module_outputs_are_refused_not_mislabelled(hub, tmp_path, monkeypatch, output):
  """`--stateful --module_output=elmo` wrote outputs labelled as the module's that differ from it (the module
  starts every call from a zero state): refused in one line, before anything is read or written."""
  text = tmp_path / "in.txt"
  text.write_text("a river bank\n")
  monkeypatch.setattr(hub, "stateful", True)
  with pytest.raises(EmbedInputError, match=rf"^--module_output={output} is what the TF-Hub module computes for "
                     r"each batch from a zero state; --stateful carries"):
    writer.embed_file(hub, text, tmp_path / "out.hdf5", output=output, progress_every=None)
  assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_a_file_url_of_a_module_folder_is_the_module():
  """It said "expected one *options*.json" for file:// of a TF-Hub (or EFML) folder."""
  found = pretrained.resolve_model("file://" + TFHUB_MODULE)
  assert found.tfhub_dir == TFHUB_MODULE and found.path == "file://" + TFHUB_MODULE
