"""ELMoForManyLangs folders a user got wrong: every mistake one line naming the file and the line or key, and
a folder's format recognised (or its missing file named) before anything is loaded. No torch needed: the
errors come before the weights are read."""
from __future__ import annotations

import json
import os
import zipfile

import pytest

import efml_util
from elmo_jax.formats import efml
from elmo_jax.sources import download
from elmo_jax.sources import pretrained


def _folder(root, *, arch=None, char_dic=None, word_dic=None, config=None) -> str:
  folder = os.path.join(str(root), "model")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config or {"config_path": "../configs/arch.json"}, f)
  with open(os.path.join(folder, "arch.json"), "w") as f:
    json.dump(efml_util.ARCHITECTURE if arch is None else arch, f)
  for name, text in (("char.dic", char_dic), ("word.dic", word_dic)):
    with open(os.path.join(folder, name), "wb") as f:
      f.write(text if isinstance(text, bytes) else "".join(
          f"{c}\t{i}\n" for i, c in enumerate(efml_util.CHARS if name == "char.dic" else efml_util.WORDS)).encode())
  for name in ("encoder.pkl", "token_embedder.pkl"):
    with open(os.path.join(folder, name), "wb") as f:
      f.write(b"not read before the errors below")
  return folder


def _arch(**edits):
  arch = json.loads(json.dumps(efml_util.ARCHITECTURE))
  for dotted, value in edits.items():
    section, key = dotted.split("__")
    if value is None:
      del arch[section][key]
    else:
      arch[section][key] = value
  return arch


ROWS = {
    "latin-1 char.dic": (dict(char_dic="<oov>\t0\n<pad>\t1\ncaf\xe9\t2\n".encode("latin-1")),
                         r"char\.dic:3: not UTF-8"),
    "superscript id": (dict(char_dic="<oov>\t0\nx\t\u00b2\n".encode()), r"char\.dic:2: expected 'token<TAB>id'"),
    "negative id": (dict(char_dic="<oov>\t0\nx\t-3\n".encode()), r"char\.dic:2: expected 'token<TAB>id'"),
    "gap in ids": (dict(word_dic="<oov>\t0\n<pad>\t1\n<bos>\t2\n<eos>\t3\nabc\t7\n".encode()),
                   r"word\.dic: its ids skip 4"),
    "architecture a list": (dict(arch=[1, 2]), r"the architecture is a JSON list, not an object"),
    "no encoder.dim": (dict(arch=_arch(encoder__dim=None)), r"'encoder' has no 'dim'"),
    "char_dim five": (dict(arch=_arch(token_embedder__char_dim="five")),
                      r"'token_embedder\.char_dim' is \"five\", not a positive integer"),
    "encoder a string": (dict(arch={**efml_util.ARCHITECTURE, "encoder": "elmo"}), r"'encoder' is a JSON str"),
    "bad filters": (dict(arch=_arch(token_embedder__filters=[[1, "4"]])), r"'token_embedder\.filters' is"),
}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_dictionary_and_architecture_errors_are_one_line_naming_file_and_line_or_key(tmp_path, row):
  kwargs, pattern = ROWS[row]
  folder = _folder(tmp_path, **kwargs)
  with pytest.raises(efml.EFMLError, match=pattern) as e:
    efml.load(folder)
  assert "\n" not in str(e.value) and folder in str(e.value)


@pytest.mark.parametrize("config_path", ["../../../../../../etc/passwd", "/etc/passwd", "C:\\etc\\passwd",
                                         "%2e%2e/%2e%2e/%2e%2e/etc/passwd"])
def test_config_path_never_opens_a_file_outside_the_folder(tmp_path, config_path, capsys):
  """config_path is a name (`outside_names.inside`): never /etc/passwd as the architecture; its file name in the folder
  or the published default."""
  folder = _folder(tmp_path, config={"config_path": config_path})
  os.remove(os.path.join(folder, "arch.json"))
  assert efml.architecture(folder)["encoder"]["dim"] == 4096  # the published default, said in one line
  assert "published default" in capsys.readouterr().out
  with open(os.path.join(folder, "passwd"), "w") as f:
    json.dump({"encoder": {"dim": 3}}, f)
  assert efml.architecture(folder) == {"encoder": {"dim": 3}}  # by file name, in the folder


@pytest.mark.parametrize("case", ["no encoder.pkl", "config.json a directory"])
def test_an_incomplete_efml_folder_is_named_as_one(tmp_path, case):
  folder = _folder(tmp_path)
  if case == "no encoder.pkl":
    os.remove(os.path.join(folder, "encoder.pkl"))
    expected = "encoder.pkl is missing"
  else:
    os.remove(os.path.join(folder, "config.json"))
    os.mkdir(os.path.join(folder, "config.json"))
    expected = "config.json is a directory, not a file"
  with pytest.raises(download.DownloadError) as e:
    pretrained.resolve_model(folder)
  assert f"{folder}: an ELMoForManyLangs model folder" in str(e.value) and expected in str(e.value)
  assert "options" not in str(e.value)


def test_file_url_of_an_efml_folder_and_a_folder_named_zip_are_folders(tmp_path):
  folder = _folder(tmp_path)
  found = pretrained.resolve_model("file://" + folder)
  assert found.weight_file == os.path.join(folder, "encoder.pkl") and found.path == "file://" + folder
  zipped = str(tmp_path / "model.zip")
  os.rename(folder, zipped)
  assert pretrained.resolve_model(zipped).weight_file == os.path.join(zipped, "encoder.pkl")


def test_a_tfhub_module_beside_another_models_files_is_ambiguous(tmp_path):
  folder = _folder(tmp_path)
  os.makedirs(os.path.join(folder, "variables"))
  open(os.path.join(folder, "variables", "variables.index"), "wb").close()
  with pytest.raises(download.DownloadError, match=r"holds a TF-Hub module \(variables/\) and an ELMoForManyLangs "
                     r"model; which one is meant is ambiguous"):
    pretrained.resolve_model(folder)


def test_an_archive_of_two_model_folders_is_ambiguous(tmp_path, monkeypatch):
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  path = str(tmp_path / "two.zip")
  with zipfile.ZipFile(path, "w") as z:
    for top in ("a", "b"):
      z.writestr(f"{top}/options.json", "{}")
      z.writestr(f"{top}/weights.hdf5", "x")
  with pytest.raises(download.DownloadError, match=r"two\.zip: holds 2 model folders \(a/, b/\); which one is meant"):
    pretrained.resolve_model(path)


def test_perplexity_of_an_efml_release_says_it_carries_no_softmax(tmp_path):
  from elmo_jax.evaluation import perplexity  # pylint: disable=g-import-not-at-top
  folder = _folder(tmp_path)
  found = pretrained.resolve_model(folder)
  text = tmp_path / "valid.txt"
  text.write_text("a b\n")
  config = perplexity.PerplexityConfig(options_file=found.options_file, weight_file=found.weight_file,
                                       text_file=str(text))
  with pytest.raises(perplexity.NoSoftmax, match=r"an ELMoForManyLangs release carries no LM softmax"):
    perplexity.check(config, None)


def test_convert_of_an_efml_zip_says_why_it_cannot(tmp_path, monkeypatch):
  """It said "missing key 'lstm'" (config.json read as options.json)."""
  from elmo_jax.sources import convert  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  folder = _folder(tmp_path)
  path = str(tmp_path / "efml.zip")
  with zipfile.ZipFile(path, "w") as z:
    for name in os.listdir(folder):
      z.write(os.path.join(folder, name), f"model/{name}")
  for spec in (path, "file://" + path):  # refused before its weights are read (they are not torch files here)
    with pytest.raises(convert.ConvertError, match=r"an ELMoForManyLangs model cannot be held in bilm-tf's layout"):
      convert.convert(spec, str(tmp_path / "out"))
