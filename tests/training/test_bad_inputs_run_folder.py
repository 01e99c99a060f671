"""Issue 34's rows of the trainer's preflight: run-folder entries of the wrong kind (every name of the run
layout, locally and in a bucket), an init_from weight file lacking a dataset, and file lists whose names hold
commas or glob characters. Each is refused in one line before anything is written, or now accepted."""
from __future__ import annotations

import json
import os
import re
import shutil

import h5py
import ml_collections
import pytest

import gcs_util
import launch_util
import tiny
from elmo_jax.data.sources import LIST_HINT, expand_paths, split_paths
from elmo_jax.runtime import run_layout, storage
from elmo_jax.training import input as input_lib, preflight
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS

gcs_server, bucket = gcs_util.gcs_server, gcs_util.bucket  # the fixtures


def _corpus(path, n: int = 40) -> str:
  return launch_util.write_corpus(str(path), n_lines=n)


def _snapshot(folder) -> dict:
  """Every entry under `folder`: relative path -> file bytes (None for a folder)."""
  out = {}
  for root, dirs, names in os.walk(folder):
    for name in dirs + names:
      path = os.path.join(root, name)
      out[os.path.relpath(path, folder)] = None if os.path.isdir(path) else open(path, "rb").read()
  return out


def test_every_name_of_the_run_layout_has_a_kind():
  """A name added to runtime/run_layout.py without saying file or folder would escape the check below."""
  names = {v for k, v in vars(run_layout).items() if k.isupper() and isinstance(v, str)}
  inside_export = {run_layout.OPTIONS_FILE, run_layout.WEIGHTS_FILE}
  assert names - inside_export == set(run_layout.TOP_FILES) | set(run_layout.TOP_FOLDERS)
  assert not set(run_layout.TOP_FILES) & set(run_layout.TOP_FOLDERS)


def _wrong_kind(workdir, name: str) -> None:
  if name in run_layout.TOP_FILES:  # a folder where the run writes a file
    (workdir / name).mkdir(parents=True)
    (workdir / name / "x").write_text("kept")
  else:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / name).write_text("kept")


@pytest.mark.parametrize("name", ["train.lock", "metrics.jsonl", "config.json", "vocab.txt", "vocab_counts.tsv",
                                  "checkpoints", "tensorboard", "export", "prepared", "eval", "profile"])
def test_a_run_folder_entry_of_the_wrong_kind_is_refused_before_anything_is_written(tmp_path, name):
  """Issue 34: train.lock or metrics.jsonl a folder, checkpoints a file: tracebacks after config.json, vocab.txt
  and prepared/ were written. Every name of the run layout is checked (the list above is the layout's: the
  test before this one), before the trainer writes anything."""
  assert name in run_layout.TOP_FILES + run_layout.TOP_FOLDERS
  workdir, config = tmp_path / "run", tiny.train_config(_corpus(tmp_path / "train.txt"))
  _wrong_kind(workdir, name)
  before = _snapshot(tmp_path)
  kind, wanted = ("folder", "file") if name in run_layout.TOP_FILES else ("file", "folder")
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check(config, str(workdir))
  assert str(e.value) == (f"{workdir}/{name} is a {kind}, where a run keeps its {name} {wanted}; move it away, "
                          "or use another --workdir")
  assert _snapshot(tmp_path) == before


@pytest.mark.slow  # the bucket emulator, as every bucket test
def test_a_bucket_run_folder_entry_of_the_wrong_kind_is_refused(bucket, tmp_path):
  """The same in a bucket workdir: an object named checkpoints, objects under train.lock/ (both stay in the
  bucket only, never in the local copy) or under metrics.jsonl/ (copied down)."""
  config = tiny.train_config(_corpus(tmp_path / "train.txt"))
  for name, obj, words in (("a", "checkpoints", "/checkpoints is a file, where a run keeps its checkpoints folder"),
                           ("b", "train.lock/x", "/train.lock is a folder, where a run keeps its train.lock file"),
                           ("c", "metrics.jsonl/x", "/metrics.jsonl is a folder, where a run keeps its metrics.jsonl "
                                                   "file")):
    workdir = f"{bucket}/{name}"
    storage.write_bytes(f"{workdir}/{obj}", b"kept")
    storage.write_bytes(f"{workdir}/config.json", b"{}")
    with pytest.raises(preflight.PreflightError, match=re.escape(words)):
      preflight.check(config, workdir)
    assert storage.listdir(workdir) == sorted(["config.json", obj.split("/")[0]])
    assert storage.read_bytes(f"{workdir}/{obj}") == b"kept"


def test_init_from_a_weight_file_lacking_a_dataset_is_refused_by_the_preflight(tmp_path):
  """Issue 34: ELMo files of the right shape whose weight file lacks char_embed passed the preflight, the run
  folder was written, then a 36-line WeightFileError traceback. The preflight opens the file's datasets."""
  model = tmp_path / "model"  # bilm-tf's fixture model, and a config of its shape
  model.mkdir()
  shutil.copy(FIXTURE_OPTIONS, model / "options.json")
  shutil.copy(FIXTURE_WEIGHTS, model / "weights.hdf5")
  config = tiny.train_config(_corpus(tmp_path / "train.txt"))
  config.options = ml_collections.ConfigDict(json.load(open(FIXTURE_OPTIONS)))
  config.init_from = str(model)
  preflight.check(config, str(tmp_path / "run"))  # whole: accepted
  with h5py.File(model / "weights.hdf5", "a") as f:
    data = f["CNN/W_cnn_1"][...]
    del f["CNN/W_cnn_1"]
    f.create_dataset("CNN/W_cnn_1", data=data[:, :1])
  with pytest.raises(preflight.PreflightError, match=re.escape("weights.hdf5: dataset 'CNN/W_cnn_1' has shape "
                                                             f"{data[:, :1].shape}, options expect {data.shape}")):
    preflight.check(config, str(tmp_path / "run"))
  with h5py.File(model / "weights.hdf5", "a") as f:
    del f["char_embed"]
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check(config, str(tmp_path / "run"))
  assert str(e.value) == (f"config.init_from={model}: {model}/weights.hdf5: dataset 'char_embed' is missing "
                          f"(options expect shape (261, {config.options.char_cnn.embedding.dim}))")
  assert not (tmp_path / "run").exists()


def test_train_files_with_a_comma_or_glob_characters_in_a_name(tmp_path, monkeypatch):
  """Issue 34: a file whose name holds a comma could not be given (the message did not say commas split), and
  an existing `train[1].txt` lost to glob syntax (it matched train1.txt). An existing literal path wins."""
  comma, bracket, one = (_corpus(tmp_path / name, n) for name, n in (("a,b.txt", 30), ("train[1].txt", 20),
                                                                      ("train1.txt", 10)))
  assert split_paths(comma) == [comma] and expand_paths(split_paths(f"{bracket}, {comma}")) == [bracket, comma]
  assert split_paths(f"{one},{comma},") == [one, comma] and split_paths(" , ") == []
  assert expand_paths([str(tmp_path / "train*.txt")]) == [one, bracket]  # a glob still expands
  monkeypatch.chdir(tmp_path)  # relative names as a config file gives them
  assert split_paths("a,b.txt,train1.txt") == ["a,b.txt", "train1.txt"]
  config = tiny.train_config(f"{comma},{bracket}")
  preflight.check(config, str(tmp_path / "run"))
  assert [f["path"] for f in input_lib.train_source(config.data)["files"]] == [comma, bracket]
  train, _ = input_lib.make_sources(config.data)
  assert len(train) == 50  # 30 + 20 sentences: train[1].txt, not train1.txt
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check(tiny.train_config(f"{one},nope,c.txt"), str(tmp_path / "run"))
  assert str(e.value) == f"config.data.train_files: nope: file not found ({LIST_HINT})"
  assert not (tmp_path / "run").exists()
