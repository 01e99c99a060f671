"""`python -m elmo_jax embed` and `embed_file`: layout, exactness, bilm-tf stateful fixture, bad input."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import parts
from elmo_jax.embedding import writer as embed
from elmo_jax.embedding.embedder import Embedder
from embed_util import SENTENCES, error_lines, model_args, stop_at_launch, write_lines
from paths import FIXTURE_DIR, FIXTURE_OPTIONS, FIXTURE_WEIGHTS


def run_cli(*args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "elmo_jax", "embed", *args], capture_output=True, text=True,
                        env=env, timeout=120)


def read_output(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  with h5py.File(path, "r") as f:
    raw = f["sentence_to_index"]
    assert raw.shape == (1,)
    index = json.loads(raw.asstr()[0])
    arrays = {k: f[k][...] for k in f if k != "sentence_to_index"}
  return arrays, index


def leftovers(directory) -> list[str]:
  return sorted(name for name in os.listdir(directory) if name.endswith(".tmp") or name.endswith(".hdf5"))


@pytest.fixture(scope="module")
def embedder() -> Embedder:
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)


@pytest.mark.slow
def test_stateless_matches_embedder_and_allennlp_layout(tmp_path, embedder):
  lines = SENTENCES[0][:4] + SENTENCES[1][:3] + [SENTENCES[0][0]]  # a duplicate: the later index wins
  out = tmp_path / "out.hdf5"
  proc = run_cli(*model_args(), f"--input_file={write_lines(tmp_path / 'in.txt', lines)}",
                 f"--output_file={out}", "--batch_size=4")
  assert proc.returncode == 0, proc.stderr
  arrays, index = read_output(out)
  assert sorted(arrays, key=int) == [str(i) for i in range(len(lines))]
  expected = embedder.embed_sentences([s.split() for s in lines], batch_size=4)
  for i, line in enumerate(lines):
    got = arrays[str(i)]
    assert got.dtype == np.float32 and got.shape == (3, len(line.split()), 32)
    np.testing.assert_array_equal(got, expected[i])
  assert index == {line: str(i) for i, line in enumerate(lines)}
  assert index[SENTENCES[0][0]] == str(len(lines) - 1)
  assert leftovers(tmp_path) == ["out.hdf5"]


@pytest.mark.slow
def test_stateful_reproduces_bilm_tf_fixture(tmp_path):
  # bilm-tf's protocol: batch i holds sentences[0][i], sentences[1][i], sentences[2][i].
  lines = [SENTENCES[k][i] for i in range(10) for k in range(3)]
  out = tmp_path / "out.hdf5"
  proc = run_cli(*model_args(), f"--input_file={write_lines(tmp_path / 'in.txt', lines)}",
                 f"--output_file={out}", "--batch_size=3", "--stateful")
  assert proc.returncode == 0, proc.stderr
  arrays, _ = read_output(out)
  for k in range(3):
    with h5py.File(os.path.join(FIXTURE_DIR, f"lm_embeddings_{k}.hdf5"), "r") as f:
      for i in range(10):
        want = np.concatenate([f[str(i)][0], f[str(i)][1]], axis=-1)  # fwd | bwd -> (n_tokens, 32)
        np.testing.assert_allclose(arrays[str(3 * i + k)][-1], want, atol=1e-5)


@pytest.mark.slow
def test_empty_line_gives_empty_entry_and_warning(tmp_path):
  lines = [SENTENCES[0][2], "", "   ", SENTENCES[0][3]]
  out = tmp_path / "out.hdf5"
  path = write_lines(tmp_path / "in.txt", lines)
  proc = run_cli(*model_args(), f"--input_file={path}", f"--output_file={out}")
  assert proc.returncode == 0, proc.stderr
  assert f"{path}:2: empty line" in proc.stderr and f"{path}:3: empty line" in proc.stderr
  arrays, index = read_output(out)
  assert arrays["1"].shape == (3, 0, 32) and arrays["2"].shape == (3, 0, 32)
  assert arrays["3"].shape == (3, len(SENTENCES[0][3].split()), 32)
  assert index[""] == "2"


@pytest.mark.slow
def test_invalid_utf8_stops_naming_the_line(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"a good line .\nanother one .\nbad \xff\xfe bytes\nlast .\n")
  out = tmp_path / "out.hdf5"
  proc = run_cli(*model_args(), f"--input_file={path}", f"--output_file={out}")
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and f"{path}:3:" in errors[0] and "UTF-8" in errors[0]
  assert leftovers(tmp_path) == []


@pytest.mark.slow
def test_missing_input_file(tmp_path):
  proc = run_cli(*model_args(), f"--input_file={tmp_path / 'nope.txt'}", f"--output_file={tmp_path / 'o.hdf5'}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and "nope.txt" in errors[0] and "not found" in errors[0]


@pytest.mark.slow
def test_truncated_weight_file(tmp_path):
  bad = tmp_path / "w.hdf5"
  with open(FIXTURE_WEIGHTS, "rb") as f:
    bad.write_bytes(f.read()[:50_000])
  proc = run_cli(f"--options_file={FIXTURE_OPTIONS}", f"--weight_file={bad}",
                 f"--input_file={write_lines(tmp_path / 'in.txt', ['a b .'])}",
                 f"--output_file={tmp_path / 'out.hdf5'}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and str(bad) in errors[0]
  assert leftovers(tmp_path) == ["w.hdf5"]


@pytest.mark.slow
@pytest.mark.parametrize("mutation", ["wrong_shape", "missing"])
def test_weight_file_naming_the_bad_dataset(tmp_path, mutation):
  bad = tmp_path / "w.hdf5"
  shutil.copy(FIXTURE_WEIGHTS, bad)
  name = "RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"
  with h5py.File(bad, "a") as f:
    del f[name]
    if mutation == "wrong_shape":
      f.create_dataset(name, data=np.zeros((64, 17), np.float32))
  proc = run_cli(f"--options_file={FIXTURE_OPTIONS}", f"--weight_file={bad}",
                 f"--input_file={write_lines(tmp_path / 'in.txt', ['a b .'])}",
                 f"--output_file={tmp_path / 'out.hdf5'}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and name in errors[0]
  if mutation == "wrong_shape":
    assert "(64, 17)" in errors[0]
  assert not (tmp_path / "out.hdf5").exists()


@pytest.mark.slow
def test_workdir(tmp_path, embedder):
  export = tmp_path / "run" / "export"
  export.mkdir(parents=True)
  shutil.copy(FIXTURE_OPTIONS, export / "options.json")
  shutil.copy(FIXTURE_WEIGHTS, export / "weights.hdf5")
  lines = SENTENCES[2][:3]
  out = tmp_path / "out.hdf5"
  proc = run_cli(f"--workdir={tmp_path / 'run'}", f"--input_file={write_lines(tmp_path / 'in.txt', lines)}",
                 f"--output_file={out}")
  assert proc.returncode == 0, proc.stderr
  arrays, _ = read_output(out)
  expected = embedder.embed_sentences([s.split() for s in lines])
  for i in range(len(lines)):
    np.testing.assert_array_equal(arrays[str(i)], expected[i])
  # An unfinished workdir is one line too.
  proc = run_cli(f"--workdir={tmp_path / 'nothing'}", f"--input_file={tmp_path / 'in.txt'}",
                 f"--output_file={tmp_path / 'o2.hdf5'}")
  assert proc.returncode == 1 and len(error_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_sigterm_leaves_no_output_or_temp_and_the_rerun_resumes(tmp_path):
  path = write_lines(tmp_path / "in.txt", [s for group in SENTENCES for s in group] * 200)  # 6000 lines: 12 parts of 512
  out = tmp_path / "out.hdf5"
  proc = subprocess.Popen([sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={path}",
                           f"--output_file={out}", "--progress_every=0.2"],
                          stderr=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  try:
    line = proc.stderr.readline()
    while line and "embedded" not in line:  # the device line comes first
      line = proc.stderr.readline()
    assert "embedded" in line, line  # the first progress line: a part is being written
    parts = tmp_path / "out.hdf5.partial" / "parts"
    while not any(n.endswith(".json") for n in os.listdir(parts)):  # and one is finished
      time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[1]
  finally:
    proc.kill()
  assert proc.returncode == 128 + signal.SIGTERM, rest
  assert "interrupted" in rest and "rerun the same command to resume" in rest and "Traceback" not in rest
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5.partial"]
  assert not [n for n in os.listdir(tmp_path / "out.hdf5.partial" / "parts") if n.endswith(".tmp")]
  proc = run_cli(*model_args(), f"--input_file={path}", f"--output_file={out}")
  assert proc.returncode == 0 and "resuming" in proc.stderr and "resumed after" in proc.stderr and "(6000 lines)" in proc.stderr, proc.stderr
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]
  with h5py.File(out, "r") as f:
    assert len(f) == 6_001  # every line and sentence_to_index


# --- the Python API -----------------------------------------------------------------------------------
def test_stateful_chunking_keeps_batches(tmp_path):
  lines = [SENTENCES[k][i] for i in range(10) for k in range(3)]
  path = write_lines(tmp_path / "in.txt", lines)
  outs = []
  for chunk_size in (2, 4096):  # 2 is rounded up to 3 = batch_size, so the batches are the same
    emb = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, stateful=True)
    out = tmp_path / f"out{chunk_size}.hdf5"
    embed.embed_file(emb, path, out, batch_size=3, chunk_size=chunk_size, progress_every=None)
    outs.append(read_output(out))
  for key in outs[0][0]:  # the token table is cleared at other points: XLA's rounding by call shape (~1e-7) apart
    np.testing.assert_allclose(outs[0][0][key], outs[1][0][key], rtol=0, atol=1e-6)
  assert outs[0][1] == outs[1][1]


def test_stateless_small_chunks_and_progress(tmp_path, embedder):
  lines = SENTENCES[1]
  path = write_lines(tmp_path / "in.txt", lines)
  stream = io.StringIO()
  stats = embed.embed_file(embedder, path, tmp_path / "out.hdf5", batch_size=2, chunk_size=3,
                           progress_every=0.0, progress_stream=stream)
  assert stats["sentences"] == 10 and stats["tokens"] == sum(len(s.split()) for s in lines)
  assert "embedded 10/10 sentences" in stream.getvalue() and "sent/s" in stream.getvalue()
  assert "ETA" in stream.getvalue()
  arrays, _ = read_output(tmp_path / "out.hdf5")
  expected = embedder.embed_sentences([s.split() for s in lines], batch_size=2)
  for i in range(len(lines)):
    np.testing.assert_allclose(arrays[str(i)], expected[i], atol=1e-6)


def test_failure_mid_run_leaves_nothing(tmp_path, embedder, monkeypatch):
  out = tmp_path / "out.hdf5"
  out.write_bytes(b"previous result")
  path = write_lines(tmp_path / "in.txt", SENTENCES[0])
  stop_at_launch(monkeypatch, embedder, 3)
  with pytest.raises(KeyboardInterrupt):
    embed.embed_file(embedder, path, out, batch_size=2, part_sentences=2, progress_every=None)
  assert out.read_bytes() == b"previous result"  # the old output is untouched, not half-replaced
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5", "out.hdf5.partial"]
  # the part fetched before the failure is kept (and nothing half-written); the rerun resumes after it
  assert sorted(os.listdir(tmp_path / "out.hdf5.partial" / "parts")) == ["000000-0000.hdf5", "000000-0000.json"]
  monkeypatch.undo()
  stats = embed.embed_file(embedder, path, out, batch_size=2, part_sentences=2, progress_every=None)
  assert stats["resumed"] == 2 and stats["sentences"] == len(SENTENCES[0]) - 2
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]
  arrays, _ = read_output(out)
  expected = embedder.embed_sentences([s.split() for s in SENTENCES[0]], batch_size=2)
  for i in range(len(SENTENCES[0])):  # one pass, its table never cleared: XLA's rounding by call shape apart
    np.testing.assert_allclose(arrays[str(i)], expected[i], rtol=0, atol=1e-6)


def test_count_lines(tmp_path):
  (tmp_path / "a").write_bytes(b"x\ny\n")
  (tmp_path / "b").write_bytes(b"x\ny")
  (tmp_path / "c").write_bytes(b"")
  assert [embed_files.count_lines(tmp_path / n) for n in "abc"] == [2, 2, 0]


def test_missing_output_directory(tmp_path, embedder):
  path = write_lines(tmp_path / "in.txt", ["a b ."])
  with pytest.raises(embed.EmbedInputError, match="its directory .* does not exist"):
    embed.embed_file(embedder, path, tmp_path / "no" / "out.hdf5", progress_every=None)
  assert sorted(os.listdir(tmp_path)) == ["in.txt"]


def test_writer_thread_error_propagates_and_leaves_nothing(tmp_path, embedder, monkeypatch):
  """An HDF5 write failing in the background writer stops the run with that error; no output, no temp."""
  out = tmp_path / "out.hdf5"
  path = write_lines(tmp_path / "in.txt", SENTENCES[1] * 3)
  written = []
  real = parts.PartWriter._write  # pylint: disable=protected-access

  def failing(self, i, text, layers):
    if len(written) == 7:
      raise OSError("disk full (injected)")
    written.append(i)
    return real(self, i, text, layers)

  monkeypatch.setattr(parts.PartWriter, "_write", failing)  # pylint: disable=protected-access
  with pytest.raises(OSError, match="disk full"):
    embed.embed_file(embedder, path, out, batch_size=2, chunk_size=4, progress_every=None)
  assert len(written) == 7
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5.partial"]
  kept = sorted(os.listdir(tmp_path / "out.hdf5.partial" / "parts"))
  assert kept == ["000000-0000.hdf5", "000000-0000.json"], kept  # chunk 1's unfinished part: removed


def test_output_gets_the_umask_permissions(tmp_path, embedder):
  old = os.umask(0o022)
  try:
    embed.embed_file(embedder, write_lines(tmp_path / "in.txt", SENTENCES[0][:2]), tmp_path / "out.hdf5",
                     progress_every=None)
  finally:
    os.umask(old)
  assert os.stat(tmp_path / "out.hdf5").st_mode & 0o777 == 0o644
