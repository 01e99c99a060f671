"""elmo_jax's own model folder (config.json + model.safetensors + card): round trips with bilm-hdf5, TF-Hub and
EFML sources bit for bit, the `safetensors` package reads what we write and we read what it writes, a bad
file or folder is refused in one line, `resolve_model` prefers the folder, a run exports one."""
from __future__ import annotations

import json
import os
import shutil
import struct

import jax
import numpy as np
import pytest

import efml_util
import fixture_models
import torch_files
from elmo_jax.formats import model_folder
from elmo_jax.formats import safetensors
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files
from elmo_jax.sources import card
from elmo_jax.sources import convert
from elmo_jax.sources import download
from elmo_jax.sources import loaded
from elmo_jax.sources import pretrained
from elmo_jax.training.export import export_model
from paths import TFHUB_BILM, TFHUB_MODULE


def _bits(model: loaded.LoadedModel) -> dict[str, tuple[str, tuple, bytes]]:
  """Every tensor of a loaded model (params, softmax, mix): dtype, shape, bytes."""
  tree = {"params": model.params, "softmax": model.softmax or {}, "mix": model.mix or {}}
  return {jax.tree_util.keystr(path): (leaf.dtype.str, leaf.shape, np.asarray(leaf).tobytes())
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _load(spec: str) -> loaded.LoadedModel:
  return loaded.load_model(pretrained.resolve_model(spec))


@pytest.fixture(scope="module")
def run_like(tmp_path_factory) -> str:
  """bilm-tf's fixture with a softmax and its vocabulary, as a run exports it."""
  return fixture_models.write_run_like(tmp_path_factory.mktemp("src"))


@pytest.mark.slow
def test_hdf5_and_tfhub_round_trips_are_bit_for_bit(run_like, tmp_path):
  st = str(tmp_path / "st")
  source = _load(run_like)
  convert.convert(run_like, st, "safetensors")
  assert sorted(os.listdir(st)) == ["README.md", "config.json", "model.safetensors", "vocab.txt"]
  folder = _load(st)
  assert folder.format == "safetensors" and folder.options == source.options
  assert _bits(folder) == _bits(source) and folder.softmax is not None
  assert (tmp_path / "st" / "vocab.txt").read_bytes() == open(os.path.join(run_like, "vocab.txt"), "rb").read()
  # back to bilm-hdf5, and into safetensors again: the same bits, the same file bytes
  convert.convert(st, str(tmp_path / "h5"))
  assert _bits(_load(str(tmp_path / "h5"))) == _bits(source)
  convert.convert(str(tmp_path / "h5"), str(tmp_path / "st2"), "safetensors")
  assert (tmp_path / "st2" / "model.safetensors").read_bytes() == (tmp_path / "st" / "model.safetensors").read_bytes()
  # TF-Hub -> safetensors keeps the module's mix (what bilm-hdf5 drops), and its biLM is bilm-tf's hdf5's
  convert.convert(TFHUB_MODULE, str(tmp_path / "hub"), "safetensors")
  hub = _load(str(tmp_path / "hub"))
  assert _bits(hub) == _bits(_load(TFHUB_MODULE)) and hub.mix is not None
  assert _bits(loaded.LoadedModel(hub.options, hub.params, "", ())) == _bits(_load(TFHUB_BILM))
  text = (tmp_path / "hub" / "README.md").read_text()
  assert "max |difference| 0 over every layer" in text and files.sha256_file(
      os.path.join(TFHUB_MODULE, "variables", "variables.index")) in text


def test_efml_round_trip_is_bit_for_bit(tmp_path):
  pytest.importorskip("torch", reason="pip install -r requirements-test.txt (torch, elmoformanylangs)")
  pytest.importorskip("elmoformanylangs", reason="pip install -r requirements-test.txt")
  src = str(tmp_path / "zh.model")
  efml_util.write_model(src, zip_format=True, seed=3)
  convert.convert(src, str(tmp_path / "st"), "safetensors")
  assert {"char.dic", "word.dic"} <= set(os.listdir(tmp_path / "st"))
  source, folder = _load(src), _load(str(tmp_path / "st"))
  assert _bits(folder) == _bits(source) and folder.token_ids.char2id == source.token_ids.char2id
  assert card.max_difference(source, folder) == 0.0
  convert.convert(str(tmp_path / "st"), str(tmp_path / "efml"), "efml")
  assert _bits(_load(str(tmp_path / "efml"))) == _bits(source)
  with pytest.raises(convert.ConvertError, match="cannot be held in bilm-tf's layout"):
    convert.convert(str(tmp_path / "st"), str(tmp_path / "h5"))
  assert not (tmp_path / "h5").exists()


def test_the_safetensors_package_reads_ours_and_we_read_its(run_like, tmp_path):
  st_numpy = pytest.importorskip("safetensors.numpy", reason="pip install -r requirements-test.txt (safetensors)")
  convert.convert(run_like, str(tmp_path / "st"), "safetensors")
  path = str(tmp_path / "st" / "model.safetensors")
  ours, metadata = safetensors.load(path)
  theirs = st_numpy.load_file(path)
  assert metadata == {"format": "elmo_jax"} and sorted(theirs) == sorted(ours)
  assert "bilm/lstm/forward_layer_0/W_0" in ours and "softmax/W" in ours
  assert all(theirs[k].dtype == ours[k].dtype and theirs[k].tobytes() == ours[k].tobytes() for k in ours)
  rng = np.random.default_rng(1)
  written = {"a": rng.standard_normal((3, 5)).astype(np.float32), "b/c": np.float64([1.5, -2]),
             "s": np.array(7, np.float32), "h": np.float16([0.25]), "e": np.zeros((0, 4), np.float32)}
  st_numpy.save_file(written, str(tmp_path / "theirs.safetensors"), metadata={"k": "v"})
  got, meta = safetensors.load(tmp_path / "theirs.safetensors")
  assert meta == {"k": "v"}
  assert {k: (v.dtype, v.shape, v.tobytes()) for k, v in got.items()} == {
      k: (v.dtype, v.shape, v.tobytes()) for k, v in written.items()}


def _rewrite(path: str, header: dict, data: bytes, pad: bytes = b"") -> None:
  raw = json.dumps(header).encode() + pad
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + data)


def _faults(path: str):
  """(what, how to break model.safetensors at `path`, the refusal's words)."""
  original = open(path, "rb").read()
  entries, metadata, start = safetensors.read_header(path)
  header = {"__metadata__": metadata, **{n: {"dtype": "F32", "shape": list(s), "data_offsets": [b, e]}
                                          for n, (_, s, b, e) in entries.items()}}
  data = original[start:]
  first = min(entries, key=lambda n: entries[n][2])
  b, e = entries[first][2:]
  nan = np.frombuffer(data[b:e], np.float32).copy()
  nan[0] = np.nan
  yield "truncated", lambda: open(path, "wb").write(original[:-7]), "truncated?"
  yield "short", lambda: open(path, "wb").write(original[:5]), "shorter than a safetensors header"
  yield "oversize header", lambda: open(path, "wb").write(struct.pack("<Q", 1 << 40) + original[8:]), "over the"
  yield "lying offsets", lambda: _rewrite(path, {**header, first: {**header[first], "data_offsets": [b + 4, e + 4]}},
                                          data), "overlap or leave a gap"
  yield "lying dtype", lambda: _rewrite(path, {**header, first: {**header[first], "dtype": "F64"}}, data), "span"
  yield "int dtype", lambda: _rewrite(path, {**header, first: {**header[first], "dtype": "I32"}}, data), "not one read"
  yield "not json", lambda: open(path, "wb").write(struct.pack("<Q", 4) + b"{{{{" + data), "not UTF-8 JSON"
  yield "nan", lambda: _rewrite(path, header, data[:b] + nan.tobytes() + data[e:]), "non-finite"
  yield "missing", lambda: safetensors.save(path, {k: v for k, v in safetensors.load(path)[0].items() if k != first}),\
      "is missing"


def test_bad_files_are_refused_in_one_line(run_like, tmp_path):
  st = tmp_path / "st"
  convert.convert(run_like, str(st), "safetensors")
  path = str(st / "model.safetensors")
  good = open(path, "rb").read()
  for what, breaks, words in _faults(path):
    breaks()
    with pytest.raises(weights_lib.WeightFileError) as e:
      _load(str(st))
    assert path in str(e.value) and words in str(e.value) and "\n" not in str(e.value), (what, str(e.value))
    open(path, "wb").write(good)
  config = json.loads((st / "config.json").read_text())
  for edit, words in (({"format_version": 99}, "a newer elmo_jax"), ({"format": "x"}, "not an elmo_jax model"),
                      ({"variant": "elmoformanylangs"}, "does not match its options")):
    (st / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(weights_lib.WeightFileError, match=words):
      _load(str(st))
  (st / "config.json").write_text(json.dumps(config))
  tensors, _ = safetensors.load(path)
  safetensors.save(path, {**tensors, "bilm/extra": np.zeros(2, np.float32)})
  with pytest.raises(weights_lib.WeightFileError, match="holds tensor 'bilm/extra', which is no parameter"):
    _load(str(st))


def test_resolve_model_prefers_the_folder_and_a_run_exports_one(run_like, tmp_path):
  both = tmp_path / "both"
  shutil.copytree(run_like, both)
  convert.convert(run_like, str(tmp_path / "st"), "safetensors")
  for name in ("config.json", "model.safetensors"):
    shutil.copy(tmp_path / "st" / name, both / name)
  found = pretrained.resolve_model(str(both))
  assert found.folder_dir == str(both) and found.options_file is None
  assert str(both / "model.safetensors") in found.read_files
  with pytest.raises(download.DownloadError, match="a safetensors model folder has no options.json"):
    pretrained.resolve(str(both))
  source = _load(run_like)
  workdir = tmp_path / "run"
  workdir.mkdir()
  shutil.copy(os.path.join(run_like, "vocab.txt"), workdir / "vocab.txt")
  export_model(str(workdir), {"bilm": source.params, "softmax": source.softmax}, source.options, "safetensors")
  assert sorted(os.listdir(workdir / "export")) == ["README.md", "config.json", "model.safetensors", "vocab.txt"]
  exported = _load(str(workdir))
  assert exported.format == "safetensors" and _bits(exported) == _bits(source)


@pytest.mark.slow
def test_fuzzed_folders_load_the_same_or_are_refused_in_one_line(run_like, tmp_path):
  pytest.importorskip("hypothesis", reason="pip install -r requirements-test.txt (hypothesis)")
  convert.convert(run_like, str(tmp_path / "st"), "safetensors")
  config = {"folder": str(tmp_path / "st"), "examples": 200}
  results = torch_files.run_limited(f"import parser_fuzz; parser_fuzz.main({json.dumps(config)!r})",
                                    memory=1 << 30, timeout=600)
  assert [r["target"] for r in results] == ["safetensors model folder", "safetensors header fields"], results
  for r in results:
    print(json.dumps(r))  # the counts, for the record (-s)
    assert r["mutants"] >= 200 and r["refused"] > 0 and r["slowest_s"] < 5, r
  assert results[1]["differs"] == 0


def test_load_elmo_refuses_an_efml_style_folder_in_one_line(tmp_path):
  pytest.importorskip("torch", reason="pip install -r requirements-test.txt (torch, elmoformanylangs)")
  pytest.importorskip("elmoformanylangs", reason="pip install -r requirements-test.txt")
  efml_util.write_model(str(tmp_path / "zh.model"), zip_format=True, seed=2)
  convert.convert(str(tmp_path / "zh.model"), str(tmp_path / "st"), "safetensors")
  with pytest.raises(weights_lib.WeightFileError, match="an ELMoForManyLangs model; Embedder.from_pretrained loads it"):
    pretrained.load(str(tmp_path / "st"))


@pytest.mark.slow  # a tiny training run
def test_a_training_run_exports_safetensors(tmp_path):
  import launch_util  # pylint: disable=g-import-not-at-top
  train = launch_util.write_corpus(str(tmp_path / "train.txt"))
  config = launch_util.write_config(str(tmp_path / "tiny.py"), train, num_train_steps=3)
  run = str(tmp_path / "run")
  proc = launch_util.launch(run, config, "--config.export_format=safetensors", log=str(tmp_path / "log"))
  assert launch_util.wait([proc], timeout=300) == [0], launch_util.read(str(tmp_path / "log"))[-2000:]
  assert {"config.json", "model.safetensors", "README.md", "vocab.txt"} <= set(os.listdir(os.path.join(run, "export")))
  model = _load(run)
  assert model.format == "safetensors" and model.softmax is not None and model.vocab_file.endswith("vocab.txt")
