"""The bad-input table of issue 11 for the embedding side: each mistake gets one clear line."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import writer as embed
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files

from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS
from tiny import tiny_options


@pytest.fixture(scope="module")
def emb():
  return Embedder.random(tiny_options(), seed=0)


@pytest.mark.parametrize("sentences, words", [
    ("hello world", "got a str ('hello world'); a sentence is a list of tokens"),
    (["hello world"], "sentence 0 is a str ('hello world'); a sentence is a list of tokens"),
    ([["a", None]], "sentence 0, token 1 is a NoneType"),
    ([["a"], ["b", 3]], "sentence 1, token 1 is a int (3); tokens must be str"),
    ([[b"a"]], "decode bytes first"),
    ([5], "sentence 0 is a int, not a list of tokens"),
])
def test_embed_sentences_refuses_what_is_not_a_list_of_token_lists(emb, sentences, words):
  with pytest.raises(TypeError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
    emb.embed_sentences(sentences)
  assert "Tokenizer" in str(e.value) or "token" in str(e.value)


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_embed_sentences_refuses_a_bad_batch_size(emb, batch_size):
  with pytest.raises(ValueError, match=f"batch_size must be a positive int, got {batch_size!r}"):
    emb.embed_sentences([["a"]], batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [0, -3, 1.5, "8", True])
def test_embedder_refuses_a_bad_batch_size_at_construction_before_loading(emb, batch_size, monkeypatch):
  """Embedder(batch_size=0) loaded the model and failed at the first call."""
  want = f"Embedder(batch_size={batch_size!r}): batch_size must be a positive int, got {batch_size!r}"
  with pytest.raises(ValueError) as e:
    Embedder(emb.options, emb.params, batch_size=batch_size, warm=False)
  assert str(e.value) == want
  from elmo_jax.sources import loaded  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(loaded, "load_model", lambda *a, **k: pytest.fail("loaded before the check"))
  with pytest.raises(ValueError) as e:
    Embedder.from_pretrained(os.path.dirname(FIXTURE_OPTIONS), batch_size=batch_size)
  assert str(e.value) == want


def test_generators_of_sentences_are_accepted(emb):
  sentences = [["the", "cat"], ["a", "dog", "ran"]]
  expected = emb.embed_sentences(sentences)
  for got in (emb.embed_sentences(s for s in sentences), emb(iter(sentences)),
              emb.embed_sentences([tuple(s) for s in sentences]), emb.embed_sentences([iter(s) for s in sentences])):
    assert len(got) == 2 and all(np.array_equal(a, b) for a, b in zip(expected, got))


def test_swapped_or_wrong_kind_of_model_files(tmp_path):
  with pytest.raises(options_lib.OptionsError, match="is an HDF5 file, not options.json .options and weight "
                     "files swapped"):
    options_lib.load(FIXTURE_WEIGHTS)
  with pytest.raises(options_lib.OptionsError, match="is a directory, not an options.json"):
    options_lib.load(tmp_path)
  opts = options_lib.load(FIXTURE_OPTIONS)
  with pytest.raises(weights_lib.WeightFileError, match="is a JSON file, not an HDF5 weight file .options "
                     "and weight files swapped"):
    weights_lib.load_hdf5(FIXTURE_OPTIONS, opts)
  with pytest.raises(weights_lib.WeightFileError, match="is a directory, not an HDF5"):
    weights_lib.load_hdf5(tmp_path, opts)
  with pytest.raises(options_lib.OptionsError, match="is an HDF5 file"):
    Embedder.from_files(FIXTURE_WEIGHTS, FIXTURE_OPTIONS)
  assert files.looks_like(FIXTURE_WEIGHTS) == "an HDF5 file"


@pytest.mark.parametrize("section, key, value, words", [
    ("lstm", "dim", "256", "lstm.dim must be an integer >= 1, got '256' (str)"),
    ("lstm", "projection_dim", 0, "lstm.projection_dim must be an integer >= 1, got 0"),
    ("lstm", "cell_clip", "3", "lstm.cell_clip must be a number or null"),
    ("lstm", "use_skip_connections", "yes", "lstm.use_skip_connections must be true or false"),
    ("char_cnn", "embedding", {"dim": "16"}, "char_cnn.embedding.dim must be an integer"),
    ("char_cnn", "filters", [[1, "32"]], "char_cnn.filters must be a non-empty list of"),
    ("char_cnn", "n_highway", 1.5, "char_cnn.n_highway must be an integer >= 0"),
])
def test_options_types_are_validated(tmp_path, section, key, value, words):
  raw = json.load(open(FIXTURE_OPTIONS))
  raw[section][key] = value
  path = tmp_path / "options.json"
  path.write_text(json.dumps(raw))
  with pytest.raises(options_lib.OptionsError, match=words.replace("(", r"\(").replace(")", r"\)")):
    options_lib.load(path)


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--options_file={FIXTURE_OPTIONS}",
                         f"--weight_file={FIXTURE_WEIGHTS}", *args], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})


@pytest.mark.slow
def test_cli_batch_size_zero_output_directory_and_swapped_files_in_one_line(tmp_path):
  inp = tmp_path / "in.txt"
  inp.write_text("the cat\n")
  proc = _cli(f"--input_file={inp}", f"--output_file={tmp_path}/o.hdf5", "--batch_size=0")
  assert proc.returncode == 1 and proc.stderr.strip() == "error: --batch_size must be >= 1, got 0", proc.stderr
  proc = _cli(f"--input_file={inp}", f"--output_file={tmp_path}")
  assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
      f"error: --output_file={tmp_path} is a directory; give a file path"], proc.stderr
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--options_file={FIXTURE_WEIGHTS}",
                         f"--weight_file={FIXTURE_OPTIONS}", f"--input_file={inp}", f"--output_file={tmp_path}/o.h5"],
                        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "swapped" in proc.stderr
  assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_stale_temp_of_a_killed_writer_is_removed_by_the_next_run(tmp_path, emb):
  inp = tmp_path / "in.txt"
  inp.write_text("the cat\na dog\n")
  out = tmp_path / "out.hdf5"
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                        text=True, check=True).stdout.strip()
  prefix = embed_files.temp_prefix(str(out))
  stale = tmp_path / (prefix.replace(f".{os.getpid()}.", f".{dead}.") + "abc.tmp")
  live = tmp_path / (prefix + "xyz.tmp")  # this process is alive: its temp is not touched
  other = tmp_path / ".other.hdf5.host.1.abc.tmp"
  for p in (stale, live, other):
    p.write_bytes(b"x" * 100)
  embed.embed_file(emb, inp, out, batch_size=2, progress_every=None)
  assert sorted(os.listdir(tmp_path)) == sorted(["in.txt", "out.hdf5", live.name, other.name])


def test_over_long_tokens_are_counted_and_reported_once(tmp_path, emb):
  inp = tmp_path / "in.txt"
  inp.write_text("short words\n" + "x" * 500 + " and " + "y" * 60 + "\nfine\n" + "z" * 49 + "\n")
  warnings = []
  stats = embed.embed_file(emb, inp, tmp_path / "o.hdf5", batch_size=2, progress_every=None, warn=warnings.append)
  assert stats["long_tokens"] == 3 and len(warnings) == 1
  assert "3 tokens longer than 48 UTF-8 bytes were cut" in warnings[0] and f"{inp}:2" in warnings[0]
