"""The output choices of `allennlp elmo` in `elmo_jax.embed`: --all/--top/--average, sentence keys, float16,
gzip and raw input, sentence vectors, token embedding dumps, and --model / URLs on the command line."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings

import h5py
import jax
import numpy as np
import pytest

from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import writer as embed
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.embedding.embedder import Embedder
from http_util import dead_url, mirror, serve_models
from paths import FIXTURE_DIR, FIXTURE_OPTIONS, FIXTURE_WEIGHTS

with open(os.path.join(FIXTURE_DIR, "lm_embeddings_sentences.json")) as _f:
  LINES: list[str] = json.load(_f)[0][:6]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)


@pytest.fixture(scope="module")
def reference(embedder) -> list[np.ndarray]:
  return embedder.embed_sentences([s.split() for s in LINES])


def write(path, lines, gz=False) -> str:
  data = "".join(line + "\n" for line in lines).encode()
  path.write_bytes(gzip.compress(data) if gz else data)
  return str(path)


def read(path, keys=None) -> dict:
  """Datasets by name; `keys` (e.g. sentences holding '/', which h5py nests in groups) read by path."""
  with h5py.File(path, "r") as f:
    keys = keys or [k for k in f if isinstance(f[k], h5py.Dataset)]
    return {k: (json.loads(f[k].asstr()[0]) if k == "sentence_to_index" else f[k][...]) for k in keys}


def run_cli(*args, env=None):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
  return subprocess.run([sys.executable, "-m", "elmo_jax", "embed", *args], capture_output=True, text=True,
                        env=env, timeout=180)


@pytest.mark.parametrize("output", ["all", "top", "average"])
def test_output_layouts(tmp_path, embedder, reference, output):
  out = tmp_path / "o.hdf5"
  embed.embed_file(embedder, write(tmp_path / "in.txt", LINES), out, output=output, progress_every=None)
  got = read(out)
  assert got["sentence_to_index"] == {line: str(i) for i, line in enumerate(LINES)}
  for i, layers in enumerate(reference):
    want = {"all": layers, "top": layers[-1], "average": layers.mean(0)}[output]
    assert got[str(i)].shape == want.shape and got[str(i)].dtype == np.float32
    np.testing.assert_allclose(got[str(i)], want, atol=1e-6)


def test_sentence_keys_float16_gzip_sentence_vectors(tmp_path, embedder, reference):
  out = tmp_path / "o.hdf5"
  path = write(tmp_path / "in.txt.gz", LINES, gz=True)
  assert embed_files.count_lines(path) == len(LINES)
  embed.embed_file(embedder, path, out, output="top", output_dtype="float16", use_sentence_keys=True,
                   sentence_vectors=True, progress_every=None)
  assert "sentence_to_index" not in read(out)  # AllenNLP: keys are the sentences
  got = read(out, LINES)  # LINES[4] holds '/', which nests it in groups; f[line] still reads it
  for line, layers in zip(LINES, reference):
    assert got[line].dtype == np.float16 and got[line].shape == (32,)
    np.testing.assert_allclose(got[line], layers[-1].mean(0), atol=2e-3, rtol=2e-3)
  embed.embed_file(embedder, path, out, sentence_vectors=True, forget_sentences=True, progress_every=None)
  got = read(out)
  assert "sentence_to_index" not in got and got["0"].shape == (3, 32)
  np.testing.assert_allclose(got["0"], reference[0].mean(1), atol=1e-6)


def test_sentence_keys_reject_repeats_and_slashes(tmp_path, embedder):
  for lines, match in (([LINES[0], LINES[1], LINES[0]], r"in.txt:3: repeats line 1"),
                       ([LINES[0], "x", "x/y"], r"in.txt:3: 'x/y' cannot name an HDF5 dataset"),
                       ([LINES[0], "", "b"], r"in.txt:2: an empty line cannot name")):
    with pytest.raises(embed.EmbedInputError, match=match):
      embed.embed_file(embedder, write(tmp_path / "in.txt", lines), tmp_path / "o.hdf5",
                       use_sentence_keys=True, progress_every=None)
    assert not (tmp_path / "o.hdf5").exists()


def test_tokenize_raw_text(tmp_path, embedder):
  raw = ["Hello, world!", "It's 5 o'clock."]
  out = tmp_path / "o.hdf5"
  tok = Tokenizer()
  embed.embed_file(embedder, write(tmp_path / "in.txt", raw), out, tokenize=tok, progress_every=None)
  got = read(out)
  assert got["sentence_to_index"] == {raw[0]: "0", raw[1]: "1"}  # keys stay the raw lines
  want = embedder.embed_sentences([tok(s) for s in raw])
  assert tok(raw[0]) == ["Hello", ",", "world", "!"]
  for i in range(2):
    np.testing.assert_allclose(got[str(i)], want[i], atol=1e-6)


def test_damaged_gzip_is_one_line(tmp_path, embedder):
  path = tmp_path / "in.txt.gz"
  text = " ".join(str(x) for x in np.random.default_rng(0).integers(0, 10**9, 20000)) + "\n"
  path.write_bytes(gzip.compress(text.encode())[:3000])
  with pytest.raises(embed.EmbedInputError, match=r"in.txt.gz:\d+: cannot read the file further"):
    embed.embed_file(embedder, str(path), tmp_path / "o.hdf5", progress_every=None)


@pytest.mark.slow
def test_cli_model_name_gzip_top_float16_then_offline(tmp_path, reference):
  path = write(tmp_path / "in.txt.gz", LINES, gz=True)
  env = {"ELMO_JAX_CACHE": str(tmp_path / "cache")}
  with serve_models(mirror(tmp_path / "www")) as (server, base):
    proc = run_cli("--model=small", f"--input_file={path}", f"--output_file={tmp_path / 'o.hdf5'}", "--top",
                   "--output_dtype=float16", env={**env, "ELMO_JAX_MODELS_URL": base})
    assert proc.returncode == 0, proc.stderr
    assert len(server.requests) == 2
  got = read(tmp_path / "o.hdf5")
  for i, layers in enumerate(reference):
    assert got[str(i)].dtype == np.float16
    np.testing.assert_allclose(got[str(i)], layers[-1], atol=2e-3, rtol=2e-3)
  # Server gone, cache kept: works offline. Cache gone too: one line naming the URL and the cache path.
  proc = run_cli("--model=small", f"--input_file={path}", f"--output_file={tmp_path / 'o2.hdf5'}",
                 env={**env, "ELMO_JAX_MODELS_URL": base})
  assert proc.returncode == 0, proc.stderr
  dead = dead_url("elmo").rsplit("/", 1)[0]
  proc = run_cli("--model=small", f"--input_file={path}", f"--output_file={tmp_path / 'o3.hdf5'}",
                 env={**env, "ELMO_JAX_MODELS_URL": dead})
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(errors) == 1
  assert dead in errors[0] and str(tmp_path / "cache") in errors[0] and "offline" in errors[0]


@pytest.mark.slow
def test_cli_urls_sentence_vectors_and_token_dump(tmp_path, embedder):
  vocab = tmp_path / "vocab.txt"
  words = sorted({w for line in LINES for w in line.split()})[:-3]  # a few words stay uncached
  vocab.write_text("\n".join(words) + "\n")
  tokens = tmp_path / "tokens.hdf5"
  with serve_models(FIXTURE_DIR) as (_, base):
    urls = [f"--options_file={base}/options.json", f"--weight_file={base}/lm_weights.hdf5"]
    env = {"ELMO_JAX_CACHE": str(tmp_path / "cache")}
    proc = run_cli(*urls, "--dump_token_embeddings", f"--vocab_file={vocab}", f"--output_file={tokens}", env=env)
    assert proc.returncode == 0, proc.stderr
    with h5py.File(tokens, "r") as f:
      assert f["embedding"].shape == (len(words), 16) and list(f["tokens"].asstr()[...]) == words
    proc = run_cli(*urls, f"--input_file={write(tmp_path / 'in.txt', LINES)}", "--sentence_vectors",
                   "--average", "--use_sentence_keys", f"--token_embedding_file={tokens}",
                   f"--output_file={tmp_path / 'v.hdf5'}", env=env)
    assert proc.returncode == 0, proc.stderr
  got = read(tmp_path / "v.hdf5", LINES)
  want = embedder.sentence_vectors([s.split() for s in LINES], "average")
  for line, vector in zip(LINES, want):
    np.testing.assert_allclose(got[line], vector, atol=1e-6)
  proc = run_cli(f"--options_file={FIXTURE_OPTIONS}", f"--weight_file={FIXTURE_WEIGHTS}", "--top", "--average",
                 f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'x.hdf5'}")
  assert proc.returncode != 0 and "at most one of --all, --top, --average" in proc.stderr


def test_float16_out_of_range_is_refused_in_one_line(tmp_path, embedder, reference):
  """Values past float16's 65,504 would be written as inf: the job is refused naming the line and the count."""
  from elmo_jax.sources import loaded  # pylint: disable=g-import-not-at-top
  from elmo_jax.sources import pretrained  # pylint: disable=g-import-not-at-top
  model = loaded.load_model(pretrained.resolve_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS))
  params = jax.tree_util.tree_map(np.array, model.params)
  params["char_cnn"]["CNN_proj"]["W_proj"] *= 1e6  # the token layer (layer 0) far past 65,504
  big = Embedder(model.options, params)
  lines = write(tmp_path / "in.txt", LINES[:2])
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # numpy's overflow warning is not the message
    with pytest.raises(embed.EmbedInputError, match=r"in.txt:1: \d+ of its \d+ values are out of float16's range "
                                                    r"\(\|x\| > 65504, the largest .*\) and would be written as inf; "
                                                    r"use --output_dtype=float32$"):
      embed.embed_file(big, lines, tmp_path / "o.hdf5", output_dtype="float16", progress_every=None)
  assert not (tmp_path / "o.hdf5").exists()
  embed.embed_file(big, lines, tmp_path / "o32.hdf5", output_dtype="float32", progress_every=None)
  assert np.abs(read(tmp_path / "o32.hdf5")["0"]).max() > 65504
