"""Sentiment probe on `tfds:NAME:SPLIT` inputs, from a tiny TFDS dataset prepared in tmp_path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import evaluate
from elmo_jax.evaluation import readers
from eval_util import fake_models
from paths import REPO_ROOT
from tfds_util import TinySst2

tfds = pytest.importorskip("tensorflow_datasets")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tfds"))
  TinySst2(data_dir=path, file_format="array_record").download_and_prepare()
  return path


def test_reader_tokenizes_like_the_tsv_reader(data_dir):
  rows = readers.read_tfds_labelled("tfds:tiny_sst2:validation", data_dir)
  assert len(rows) == 40 and {r.label for r in rows} == {"0", "1"}
  assert rows[0].tokens[-1] == "." and rows[0].line == 0
  assert readers.parse_tfds("tfds:glue/sst2:2.0.0:train[:10%]") == ("glue/sst2:2.0.0", "train[:10%]")
  with pytest.raises(readers.InputError, match="no feature 'text'.*--tfds_text_key"):
    readers.read_tfds_labelled("tfds:tiny_sst2:train", data_dir, text_key="text")


@pytest.mark.slow
def test_sentiment_probe_on_tfds_splits(tmp_path, data_dir, parsed_flags):
  out = str(tmp_path / "out")
  parsed_flags("--task=sentiment", f"--output_dir={out}", f"--tfds_data_dir={data_dir}",
               "--train_file=tfds:tiny_sst2:train", "--test_file=tfds:tiny_sst2:validation",
               "--probe_max_epochs=10")
  evaluate.main(["evaluate.py"], load_models=fake_models())
  data = json.load(open(os.path.join(out, "sentiment.json")))
  assert data["data"]["train"] == 120 and data["data"]["test"] == 40
  assert data["data"]["labels"] == ["0", "1"]
  assert data["data"]["test_file"] == "tfds:tiny_sst2:validation"
  for model in ("trained", "untrained"):
    assert data[model]["n"] == 40
    for key in ("layer_0", "layer_1", "layer_2", "mix", "mix_weights"):
      assert key in data[model], (model, key)
  # The same flags through --sentiment_*_file hit the feature cache (keyed by the records).
  parsed_flags("--task=sentiment", f"--output_dir={out}", f"--tfds_data_dir={data_dir}",
               "--sentiment_train_file=tfds:tiny_sst2:train",
               "--sentiment_test_file=tfds:tiny_sst2:validation", "--probe_max_epochs=10")
  models = fake_models()()
  evaluate.main(["evaluate.py"], load_models=lambda: models)
  assert models.trained.calls == 0


@pytest.mark.parametrize("task, test_file, message", [
    ("sentiment", "tfds:tiny_sst2:test",
     r"tfds:tiny_sst2:test: record 0 has label -1: an unlabelled split"),
    ("sentiment", "tfds:glue/sst2:validation",  # known to TFDS, not prepared here
     r"'glue/sst2' is not prepared under --tfds_data_dir=.*download=True.*"
     r"tfds build glue/sst2 --file_format=array_record"),
    ("sentiment", "tfds:no_such_ds:validation",
     r"'no_such_ds' is not registered nor found under .*download=True"),
    ("sentiment", "tfds:tiny_sst2", "expected tfds:NAME:SPLIT"),
    ("pos", "tfds:tiny_sst2:validation", "for sentiment only"),
])
def test_bad_tfds_input_exits_with_one_line(tmp_path, data_dir, parsed_flags, task, test_file,
                                            message):
  parsed_flags(f"--task={task}", f"--output_dir={tmp_path}/out", f"--tfds_data_dir={data_dir}",
               "--train_file=tfds:tiny_sst2:train", f"--test_file={test_file}")
  loads = []
  with pytest.raises(SystemExit, match=message) as e:
    evaluate.main(["evaluate.py"], load_models=fake_models(loads))
  assert "\n" not in str(e.value.code) and loads == []  # fails before loading any model


@pytest.mark.slow
def test_cli_missing_dataset_is_one_line_on_stderr(tmp_path):
  """No TFDS warning ("Variant folder ... has no dataset_info.json") joins the error line."""
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO_ROOT, "evaluate.py"), "--task=sentiment",
       f"--output_dir={tmp_path}/out", f"--tfds_data_dir={tmp_path}/tfds",
       "--sentiment_train_file=tfds:glue/sst2:train",
       "--sentiment_test_file=tfds:glue/sst2:validation"],
      capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
      env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and "'glue/sst2' is not prepared" in err[0], proc.stderr
  assert "tfds.data_source('glue/sst2', data_dir=" in err[0]
