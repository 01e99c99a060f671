"""ELMoForManyLangs models: exact against the elmoformanylangs package, the torch.save reader, its refusals."""
from __future__ import annotations

import io
import json
import os
import pickle
import zipfile

import numpy as np
import pytest

import efml_util
from elmo_jax.data import chars
from elmo_jax.formats import efml
from elmo_jax.formats import torch_pickle
from elmo_jax.sources import pretrained

PIP = "pip install -r requirements-test.txt (torch==2.13.0 elmoformanylangs==0.0.4.post2 overrides==3.1.0)"


def _needs_efml():
  pytest.importorskip("torch", reason=PIP)
  pytest.importorskip("elmoformanylangs", reason=PIP)


@pytest.fixture(scope="module")
def efml_folders(tmp_path_factory):
  """{format: a tiny EFML model folder} with the same random weights, saved legacy (PyTorch 0.4) and zip."""
  _needs_efml()
  root = tmp_path_factory.mktemp("efml")
  out = {}
  for fmt in ("legacy", "zip"):
    out[fmt] = str(root / fmt)
    efml_util.write_model(out[fmt], zip_format=fmt == "zip")
  return out


@pytest.mark.slow
def test_exact_against_elmoformanylangs(efml_folders):
  """All three layers of every sentence within 1e-5 of EFML's own `sents2elmo` (one batch: a fresh state),
  from both file formats; its output_layer choices map to ours; resolve_model and from_pretrained take it."""
  from elmoformanylangs import Embedder as EFMLEmbedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.args import select_layers  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top

  legacy = efml_folders["legacy"]
  with open(os.path.join(legacy, "encoder.pkl"), "rb") as f:
    assert not f.read(4).startswith(b"PK")  # really the legacy layout (the zip one starts with PK)
  reference = EFMLEmbedder(legacy)
  want = reference.sents2elmo(efml_util.SENTENCES, output_layer=-2)
  model = pretrained.resolve_model(legacy)
  assert model.files == (os.path.join(legacy, "config.json"), os.path.join(legacy, "encoder.pkl"))
  for fmt, folder in efml_folders.items():
    emb = Embedder.from_pretrained(folder)
    assert emb.n_layers == 3 and emb.output_dim == 16 and emb.model_files == pretrained.resolve(folder)
    assert set(emb.input_files) == {os.path.join(folder, n) for n in  # the architecture JSON too (issue 54)
                                    ("config.json", "char.dic", "word.dic", "encoder.pkl", "token_embedder.pkl",
                                     "tiny.json")}
    got = emb.embed_sentences(efml_util.SENTENCES)
    for sentence, g, w in zip(efml_util.SENTENCES, got, want):
      assert g.shape == w.shape == (3, len(sentence), 16)
      np.testing.assert_allclose(g, w, atol=1e-5, rtol=0, err_msg=f"{fmt}: {sentence}")
  # EFML's encoder carries its LSTM state from call to call (and batch to batch): a second call differs.
  again = reference.sents2elmo(efml_util.SENTENCES, output_layer=-2)
  assert max(np.abs(a - w).max() for a, w in zip(again, want)) > 1e-3
  for output_layer, ours in efml.OUTPUT_LAYERS.items():
    reference.model.encoder.reset_states()  # what every call of ours starts from
    theirs = reference.sents2elmo(efml_util.SENTENCES[:2], output_layer=output_layer)
    for g, w in zip(got, theirs):
      np.testing.assert_allclose(select_layers(g, ours), w, atol=1e-5, rtol=0, err_msg=str(output_layer))
  with pytest.raises(efml.EFMLError, match="Embedder.from_pretrained loads it"):
    pretrained.load_elmo(legacy)  # it would build bilm-tf char ids: refused in one line, not a wrong model


def test_legacy_and_zip_pkl_read_as_torch_does(tmp_path):
  """A state dict of float32 / float16 / int64 tensors, non-contiguous and sharing a storage at an offset,
  reads from both torch.save formats as torch.load reads it (bit for bit, dtypes kept)."""
  _needs_efml()
  import torch  # pylint: disable=g-import-not-at-top
  base = torch.randn(6, 5)
  state = {"w": torch.randn(4, 3), "t": base.t(), "view": base[2:, 1:4], "half": torch.randn(7).half(),
           "ids": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4), "scalar": torch.tensor(2.5)}
  for fmt in ("legacy", "zip"):
    path = tmp_path / f"{fmt}.pkl"
    torch.save(state, path, _use_new_zipfile_serialization=fmt == "zip")
    got = torch_pickle.load(path)
    assert list(got) == list(state)
    for k, v in torch.load(path, weights_only=True).items():
      assert got[k].dtype == v.numpy().dtype and got[k].shape == tuple(v.shape), (fmt, k)
      np.testing.assert_array_equal(got[k], v.numpy(), err_msg=f"{fmt}: {k}")


def test_vocabulary_and_weights_size_mismatch_named_in_one_line(efml_folders, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path / "model")
  shutil.copytree(efml_folders["zip"], folder)
  with open(os.path.join(folder, "word.dic"), "a", encoding="utf-8") as f:
    f.write(f"extra\t{len(efml_util.WORDS)}\n")
  with pytest.raises(efml.EFMLError) as e:
    efml.load(folder)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(os.path.join(folder, "word.dic") + ": 9 entries")
  assert "word_emb_layer.embedding.weight' has 8 rows" in message


class _MakesAFile:
  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (os.system, (f"touch {self.path}",))


def test_disallowed_global_refused_without_running_it(tmp_path):
  """A pickle whose reduce would run `os.system` is refused naming the global, in both layouts; nothing ran."""
  marker = tmp_path / "ran"
  payload = pickle.dumps({"w": _MakesAFile(marker)}, protocol=2)
  legacy = tmp_path / "legacy.pkl"
  legacy.write_bytes(b"".join(pickle.dumps(v, protocol=2) for v in (0x1950A86A20F9469CFC6C, 1001, {})) + payload)
  packed = io.BytesIO()
  with zipfile.ZipFile(packed, "w") as z:
    z.writestr("archive/data.pkl", payload)
  (tmp_path / "zip.pkl").write_bytes(packed.getvalue())
  for path in (legacy, tmp_path / "zip.pkl"):
    with pytest.raises(torch_pickle.TorchPickleError) as e:
      torch_pickle.load(path)
    assert str(e.value).startswith(f"{path}: names {os.system.__module__}.system, which a state dict")
    assert "refused without running it" in str(e.value) and "\n" not in str(e.value)
  assert not marker.exists()


def test_missing_architecture_json_uses_the_published_default(tmp_path, capsys):
  (tmp_path / "config.json").write_text(json.dumps({"config_path": "/home/author/configs/cnn_50_100_512_4096_sample.json"}))
  arch = efml.architecture(str(tmp_path))
  assert arch["encoder"] == {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096,
                             "n_layers": 2}
  assert arch["token_embedder"]["word_dim"] == 100 and arch["token_embedder"]["char_dim"] == 50
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 1 and "cnn_50_100_512_4096_sample shape" in lines[0]
  (tmp_path / "cnn_50_100_512_4096_sample.json").write_text(json.dumps({"encoder": {"dim": 7}}))
  assert efml.architecture(str(tmp_path)) == {"encoder": {"dim": 7}}  # found by file name in the folder
  assert capsys.readouterr().out == ""


def test_lexicon_ids_as_efml_assigns_them(tmp_path):
  """Code points through char.dic, `<oov>` for the rest, a cut to max_chars - 2 code points, EFML's swapped
  begin/end-of-word ids, the word id first; read_dic's U+3000 line."""
  path = tmp_path / "char.dic"
  path.write_text("".join(f"{c}\t{i}\n" for i, c in enumerate(efml_util.CHARS)), encoding="utf-8")
  char2id = chars.read_dic(str(path))
  assert char2id == {c: i for i, c in enumerate(efml_util.CHARS)}  # "\u3000\t6" strips to "6"
  word2id = {w: i for i, w in enumerate(efml_util.WORDS)}
  ids = chars.LexiconIds(char2id, word2id, max_chars=12)
  c = lambda s: char2id[s] + 1  # noqa: E731
  pad, begin, end = c("<pad>"), c("<eow>"), c("<bow>")
  assert ids("中文").tolist() == [word2id["中文"] + 1, begin, c("中"), c("文"), end] + [pad] * 8
  assert ids("aZ").tolist() == [word2id["<oov>"] + 1, begin, c("a"), c("<oov>"), end] + [pad] * 8
  long = ids("abcdefghijéé")  # 12 code points: cut to 10
  assert long.tolist() == [word2id["<oov>"] + 1, begin] + [c(x) for x in "abcdefghij"] + [end]
  assert ids.special[0] == tuple([word2id["<bos>"] + 1, begin, c("<bos>"), end] + [pad] * 9)
  assert (ids.pad_id, ids.lead) == (pad, 1)
