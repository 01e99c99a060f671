"""`loaded.load_model`, the one load of what `resolve_model` found: each format's options, params (bit for bit
the reader's), softmax, vocabulary, mix, char ids, files and note; and every loader gives what it gives."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import efml_util
from elmo_jax.formats import efml
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights as weights_lib
from elmo_jax.sources import convert
from elmo_jax.sources import loaded
from elmo_jax.sources import pretrained
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, TFHUB_MODULE


def _same(a, b) -> None:
  assert sorted(a) == sorted(b)
  for k in a:
    if isinstance(a[k], dict):
      _same(a[k], b[k])
    else:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_bilm_hdf5_pair_with_its_softmax_and_the_vocab_beside(tmp_path):
  for name in ("options.json", "weights.hdf5"):
    shutil.copyfile(FIXTURE_OPTIONS if name.endswith("json") else FIXTURE_WEIGHTS, tmp_path / name)
  model = loaded.load_model(pretrained.resolve_model(str(tmp_path)))
  options = options_lib.load(FIXTURE_OPTIONS)
  want = weights_lib.load_hdf5(FIXTURE_WEIGHTS, options)
  assert model.format == "bilm-hdf5" and model.options == options
  assert model.files == (str(tmp_path / "options.json"), str(tmp_path / "weights.hdf5"))
  _same(model.params, want["params"])
  assert (model.softmax is None) == (want["softmax"] is None)
  assert model.vocab_file is None and model.mix is None and model.token_ids is None and model.note is None
  (tmp_path / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n")
  again = loaded.load_model(pretrained.resolve_model(str(tmp_path)))
  assert again.vocab_file == str(tmp_path / "vocab.txt") and again.input_files == (*model.files, again.vocab_file)
  assert pretrained.load(str(tmp_path))[0] == model.options
  assert convert.load(str(tmp_path)).input_files == again.input_files


def test_explicit_pair_and_tfhub_module():
  pair = pretrained.resolve_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)
  assert pair.files == (FIXTURE_OPTIONS, FIXTURE_WEIGHTS) and pair.efml_dir is None
  module = tfhub.load(TFHUB_MODULE, quiet=True)
  model = loaded.load_model(pretrained.resolve_model(TFHUB_MODULE))
  assert model.format == "tfhub" and model.options == module.options and model.files == module.files
  _same(model.params, module.params)
  _same(model.mix, module.mix)
  assert model.softmax is None and model.note.startswith("the module's learned mix has no place")


def test_efml_folder_with_its_char_ids(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("elmoformanylangs")
  folder = str(tmp_path / "m")
  efml_util.write_model(folder, zip_format=True)
  options, params, token_ids = efml.load(folder)
  found = pretrained.resolve_model(folder)
  assert found.efml_dir == folder and pretrained.resolve_files(*found.files) == found
  model = loaded.load_model(found)
  assert model.format == "efml" and model.options == options and model.token_ids.special == token_ids.special
  _same(model.params, params)
  assert model.files[:2] == found.files and set(model.files) == set(efml.model_files(folder).values())
  with pytest.raises(efml.EFMLError, match=r"an ELMoForManyLangs model; Embedder.from_pretrained loads it"):
    pretrained.load(folder)
  with pytest.raises(convert.ConvertError, match="cannot be held in bilm-tf's layout"):
    convert.convert(folder, str(tmp_path / "out"), "bilm-hdf5")  # read, and written as --format=efml
  assert convert.load(folder).format == "efml" and not (tmp_path / "out").exists()


def test_a_run_without_its_export_says_so_in_one_line(tmp_path):
  (tmp_path / "export").mkdir()
  with pytest.raises(FileNotFoundError, match=r"options.json: not found \(has .* finished a checkpoint\?\)$"):
    loaded.load_model(pretrained.resolve_model(str(tmp_path)))
  assert os.listdir(tmp_path / "export") == []
