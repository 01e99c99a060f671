"""Starting an EFML-style run or continuing an EFML folder: each mistake is one line naming what the user gave,
before anything is built or written (issue 54's poor rows: a 34-line traceback for a blank text under
configs/efml.py; an EFML source under configs/default.py blamed on config.data.lexicon, which the user never
set; an EFML folder missing encoder.pkl taken for another format's folder)."""
from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

import efml_util
import tiny
from elmo_jax.training import preflight, variant
from elmo_jax.training.init_from import InitFromError
from paths import REPO_ROOT


def _config(name: str):
  spec = importlib.util.spec_from_file_location(f"_cfg_{name}", os.path.join(REPO_ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.fixture(scope="module")
def efml_folder(tmp_path_factory):
  pytest.importorskip("torch")
  folder = str(tmp_path_factory.mktemp("efml") / "model")
  efml_util.write_model(folder, zip_format=True)
  return folder


@pytest.mark.parametrize("text", ["\n\n  \n", "the\x00cat\n" * 10])
def test_a_blank_or_binary_text_under_configs_efml_is_one_line_before_the_lexicon(tmp_path, text):
  (tmp_path / "t.txt").write_text(text)
  c = _config("efml")
  c.data.train_files, c.data.eval_files = str(tmp_path / "t.txt"), ""
  with pytest.raises(InitFromError) as e:
    variant.resolve(c, str(tmp_path / "run"))
  message = str(e.value)
  assert message.startswith(f"config.data.train_files: {tmp_path / 't.txt'} ") and "\n" not in message, message
  assert message.endswith("(config.data.lexicon='build' makes the lexicons from it)"), message
  assert ("is empty (no non-blank line)" if "\x00" not in text else "holds NUL bytes") in message
  assert not (tmp_path / "run").exists()


def test_an_efml_source_under_the_default_config_names_init_from(tmp_path, efml_folder):
  (tmp_path / "t.txt").write_text("the cat sat .\n" * 10)
  c = tiny.train_config(str(tmp_path / "t.txt"), init_from=efml_folder)
  with pytest.raises(InitFromError) as e:
    variant.resolve(c, str(tmp_path / "run"))
  assert str(e.value) == (f"config.init_from={efml_folder} is an ELMoForManyLangs-style model (char.dic, "
                          "word.dic), but config.options is a bilm-tf-style shape (byte ids): continue it with "
                          "configs/finetune.py, which takes the model's options from the source")
  c.data.lexicon = efml_folder  # set by the user: the message names what they set, as before
  with pytest.raises(InitFromError, match=r"^config\.data\.lexicon="):
    variant.resolve(c, str(tmp_path / "run"))


@pytest.mark.parametrize("config_name", ["default", "finetune"])
def test_an_efml_folder_missing_encoder_pkl_is_named_as_such(tmp_path, efml_folder, config_name):
  broken = tmp_path / "broken"
  shutil.copytree(efml_folder, broken)
  os.remove(broken / "encoder.pkl")
  (tmp_path / "t.txt").write_text("the cat sat .\n" * 10)
  c = tiny.train_config(str(tmp_path / "t.txt")) if config_name == "default" else _config("finetune")
  c.init_from, c.data.train_files, c.data.eval_files = str(broken), str(tmp_path / "t.txt"), ""
  want = (f"config.init_from={broken}: an ELMoForManyLangs model folder (it has config.json, char.dic, word.dic, "
          "token_embedder.pkl), but encoder.pkl is missing")
  with pytest.raises(InitFromError) as e:
    variant.resolve(c, str(tmp_path / "run"))
  assert str(e.value).startswith(want), str(e.value)
  if config_name == "default":  # the preflight's own check says the same (train.py calls both)
    with pytest.raises(preflight.PreflightError, match="but encoder.pkl is missing"):
      preflight.check(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
