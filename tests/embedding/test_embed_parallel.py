"""Embedding on many devices and many processes, and resuming a killed job (`embed_step`, `embed_job`).

The references: the same `Embedder` on one device (8 simulated devices vs 1: equal to 1e-6, the matmuls'
other row counts round differently), and an uninterrupted one-process `embed_file` run (2 processes, a
resumed run: equal bit for bit, since both go through the same parts).
"""
from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from elmo_jax.embedding import writer as embed
from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding.embedder import Embedder
from launch_util import env, free_port
from embed_util import (SENTENCES, assert_same_contents, contents, error_lines, model_args, stop_at_launch,
                        write_lines)
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT

LINES = [s for group in SENTENCES for s in group]  # 30 fixture sentences, lengths 1-22


@pytest.fixture(scope="module")
def embedder() -> Embedder:
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)


# The 8-device side of every output mode; the 1-device side is computed the same way in the test process.
_EIGHT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from elmo_jax.embedding import writer as embed
    from elmo_jax.embedding.embedder import Embedder
    options, weights, text, out = sys.argv[1:5]
    sentences = [line.split() for line in open(text)]
    for stateful in (False, True):
      eight = Embedder.from_files(options, weights, stateful=stateful)
      assert len(eight.devices) == 8  # all local devices by default
      # batch 5: rows padded to 8 (one sentence per device, three empty rows); stateful: state rows split too
      np.savez(f"{out}/eight-{stateful}.npz", *eight.embed_sentences(sentences, 5))
    eight = Embedder.from_files(options, weights)
    np.save(f"{out}/eight-vectors.npy", eight.sentence_vectors(sentences, "top"))
    np.save(f"{out}/eight-tokens.npy", eight.token_embeddings(sorted({t for s in sentences for t in s})))
    for output in ("all", "average"):
      embed.embed_file(eight, text, f"{out}/eight-{output}.hdf5", batch_size=4, output=output, progress_every=None)
    embed.embed_file(eight, text, f"{out}/eight-vectors.hdf5", batch_size=4, sentence_vectors=True,
                     progress_every=None)
""")


@pytest.mark.slow  # a subprocess on 8 simulated devices
def test_eight_devices_equal_one_in_every_mode(tmp_path, embedder):
  text = write_lines(tmp_path / "in.txt", LINES)
  proc = subprocess.run([sys.executable, "-c", _EIGHT, FIXTURE_OPTIONS, FIXTURE_WEIGHTS, text, str(tmp_path)],
                        capture_output=True, text=True, env=env(devices=8), timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  sentences = [line.split() for line in LINES]
  for stateful in (False, True):
    one = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, stateful=True) if stateful else embedder
    with np.load(tmp_path / f"eight-{stateful}.npz") as eight:
      for i, layers in enumerate(one.embed_sentences(sentences, 5)):
        np.testing.assert_allclose(eight[f"arr_{i}"], layers, atol=1e-6, rtol=0)
  np.testing.assert_allclose(np.load(tmp_path / "eight-vectors.npy"), embedder.sentence_vectors(sentences, "top"),
                             atol=1e-6, rtol=0)
  np.testing.assert_allclose(np.load(tmp_path / "eight-tokens.npy"),
                             embedder.token_embeddings(sorted({t for s in sentences for t in s})), atol=1e-6, rtol=0)
  for output in ("all", "average"):
    embed.embed_file(embedder, text, tmp_path / f"one-{output}.hdf5", batch_size=4, output=output, progress_every=None)
    a, b = contents(tmp_path / f"one-{output}.hdf5"), contents(tmp_path / f"eight-{output}.hdf5")
    assert sorted(a) == sorted(b) and a["sentence_to_index"] == b["sentence_to_index"]
    for key in a:
      if key != "sentence_to_index":
        assert a[key].shape == b[key].shape
        np.testing.assert_allclose(a[key], b[key], atol=1e-6, rtol=0, err_msg=key)
  vectors, full = contents(tmp_path / "eight-vectors.hdf5"), contents(tmp_path / "eight-all.hdf5")
  np.testing.assert_allclose(vectors["3"], full["3"].mean(axis=1), atol=1e-6)


def test_devices_choice_is_checked():
  with pytest.raises(ValueError, match="devices=3: this process has 1 local device"):
    Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, devices=3)


def corpus_lines(n: int) -> list[str]:
  """The first n lines of the shipped corpus: enough distinct tokens that where a token's char-CNN output
  is first computed shows in its last bits (see `Embedder.batches`' fresh_every)."""
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "train.txt.gz"), "rt", encoding="utf-8") as f:
    return [next(f).strip() for _ in range(n)]


@pytest.mark.slow
def test_parts_are_independent_of_where_a_run_stopped(tmp_path, embedder, monkeypatch):
  """Runs that stop at different parts, then finish: every file equals the uninterrupted run's, bit for bit."""
  text = write_lines(tmp_path / "in.txt", corpus_lines(240))
  whole = tmp_path / "whole.hdf5"
  kwargs = dict(batch_size=8, chunk_size=64, part_sentences=16, progress_every=None)
  embed.embed_file(embedder, text, whole, **kwargs)
  for stop_after in (1, 11):
    out = tmp_path / f"resumed{stop_after}.hdf5"
    stop_at_launch(monkeypatch, embedder, stop_after + 2)  # after `stop_after` batches were fetched
    with pytest.raises(KeyboardInterrupt):
      embed.embed_file(embedder, text, out, **kwargs)
    monkeypatch.undo()
    job = embed_job.Job(str(out))
    done = job.done_counts()[0]
    assert done == 16 * (stop_after // 2)  # the whole parts (of 2 batches) among the fetched batches
    stats = embed.embed_file(embedder, text, out, **kwargs)
    assert stats["resumed"] == done and stats["sentences"] == 240 - done
    assert_same_contents(contents(out), contents(whole))
    assert not os.path.exists(job.folder)


def test_stateful_resume_continues_the_state(tmp_path, monkeypatch):
  text = write_lines(tmp_path / "in.txt", LINES)
  kwargs = dict(batch_size=3, part_sentences=6, progress_every=None)
  embed.embed_file(Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, stateful=True), text, tmp_path / "whole.hdf5", **kwargs)
  emb = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, stateful=True)
  stop_at_launch(monkeypatch, emb, 6)
  with pytest.raises(KeyboardInterrupt):
    embed.embed_file(emb, text, tmp_path / "out.hdf5", **kwargs)
  parts = sorted(os.listdir(tmp_path / "out.hdf5.partial" / "parts"))
  assert "000000-0000.npz" in parts and "000000-0001.json" in parts  # 4 batches fetched: 2 parts
  fresh = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, stateful=True)  # a new process: no state in memory
  stats = embed.embed_file(fresh, text, tmp_path / "out.hdf5", **kwargs)
  assert stats["resumed"] == 12
  assert_same_contents(contents(tmp_path / "out.hdf5"), contents(tmp_path / "whole.hdf5"))


def test_stateful_over_processes_is_refused(tmp_path):
  text = write_lines(tmp_path / "in.txt", LINES)
  emb = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, stateful=True)
  with pytest.raises(embed.EmbedInputError, match="runs in one process"):
    embed.embed_file(emb, text, tmp_path / "o.hdf5", process_index=0, process_count=2, progress_every=None)
  assert os.listdir(tmp_path) == ["in.txt"]


def test_a_failed_process_stops_process_0_instead_of_leaving_it_waiting(tmp_path, embedder, monkeypatch):
  text = write_lines(tmp_path / "in.txt", LINES)
  kwargs = dict(batch_size=4, chunk_size=8, part_sentences=4, progress_every=None, process_count=2)
  monkeypatch.setattr(embedder, "_launch", lambda prepared: (_ for _ in ()).throw(OSError("disk full")))
  with pytest.raises(OSError):
    embed.embed_file(embedder, text, tmp_path / "o.hdf5", process_index=1, **kwargs)
  monkeypatch.undo()
  with pytest.raises(embed_job.JobError, match=r"failed process 1: OSError: disk full; .* rerun every process"):
    embed.embed_file(embedder, text, tmp_path / "o.hdf5", process_index=0, **kwargs)
  assert not (tmp_path / "o.hdf5").exists()
  # the rerun of process 1 clears its report and does its share; then process 0 finishes the file
  assert embed.embed_file(embedder, text, tmp_path / "o.hdf5", process_index=1, **kwargs)["wrote"] is False
  stats = embed.embed_file(embedder, text, tmp_path / "o.hdf5", process_index=0, **kwargs)
  assert stats["resumed"] == 30 and stats["sentences"] == 0 and stats["wrote"]  # both shares were done
  whole = tmp_path / "whole.hdf5"
  embed.embed_file(embedder, text, whole, batch_size=4, chunk_size=8, part_sentences=4, progress_every=None)
  assert_same_contents(contents(tmp_path / "o.hdf5"), contents(whole))


def test_changed_input_or_flags_on_rerun_are_refused(tmp_path, embedder, monkeypatch):
  text = write_lines(tmp_path / "in.txt", LINES)
  out = tmp_path / "out.hdf5"
  stop_at_launch(monkeypatch, embedder, 3)
  with pytest.raises(KeyboardInterrupt):
    embed.embed_file(embedder, text, out, batch_size=4, part_sentences=4, progress_every=None)
  monkeypatch.undo()
  parts = tmp_path / "out.hdf5.partial" / "parts"
  before = sorted(os.listdir(parts))
  write_lines(tmp_path / "in.txt", LINES[:-1] + ["a changed last line"])
  with pytest.raises(embed_job.JobError, match=r"another run \(input.sha256 is .* there, .* here\).*delete"):
    embed.embed_file(embedder, text, out, batch_size=4, part_sentences=4, progress_every=None)
  write_lines(tmp_path / "in.txt", LINES)
  with pytest.raises(embed_job.JobError, match="format.output is \"all\" there, \"top\" here"):
    embed.embed_file(embedder, text, out, batch_size=4, part_sentences=4, output="top", progress_every=None)
  assert sorted(os.listdir(parts)) == before  # nothing lost: the original command still resumes
  assert embed.embed_file(embedder, text, out, batch_size=4, part_sentences=4, progress_every=None)["resumed"] == 4


@pytest.mark.slow
def test_kill_9_then_rerun_gives_the_same_file(tmp_path, embedder):
  lines = LINES * 100  # 3,000 lines: 24 parts of 128 (2 batches); killed after 8
  text = write_lines(tmp_path / "in.txt", lines)
  args = [sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={text}", "--part_sentences=128",
          "--progress_every=0.5"]
  whole = tmp_path / "whole.hdf5"  # the uninterrupted run, in this process: the command's parts, the same bits
  embed.embed_file(embedder, text, whole, part_sentences=128, progress_every=None)
  out = tmp_path / "out.hdf5"
  proc = subprocess.Popen(args + [f"--output_file={out}"], env=env(), stderr=subprocess.DEVNULL)
  parts = tmp_path / "out.hdf5.partial" / "parts"
  try:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len([n for n in os.listdir(parts) if n.endswith(".json")]
                                               if parts.exists() else []) < 8:
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  finally:
    proc.kill()
  assert not out.exists()
  done = embed_job.Job(str(out)).done_counts()[0]
  assert 0 < done < len(lines)
  rerun = subprocess.run(args + [f"--output_file={out}"], env=env(), capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0 and f"resumed after {done} in earlier runs" in rerun.stderr, rerun.stderr[-2000:]
  assert_same_contents(contents(out), contents(whole))
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5", "whole.hdf5"]


@pytest.mark.slow
def test_two_processes_write_the_one_process_file(tmp_path, embedder):
  text = write_lines(tmp_path / "in.txt", LINES * 20)  # 600 lines: chunks of 64 lines, 10 chunks
  common = [sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={text}", "--chunk_size=64",
            "--part_sentences=32", "--progress_every=0.2"]
  # The one-process file, in this process (the command's parts, the same bits).
  embed.embed_file(embedder, text, tmp_path / "one.hdf5", chunk_size=64, part_sentences=32, progress_every=None)
  port = free_port()
  procs = [subprocess.Popen(common + [f"--output_file={tmp_path / 'two.hdf5'}", "--num_processes=2",
                                      f"--coordinator_address=127.0.0.1:{port}", f"--process_id={i}"],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  logs = [p.communicate(timeout=600)[1] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
  assert "wrote" in logs[0] and "(600 lines)" in logs[0] and "done with my share" in logs[1]
  assert "embedded 600/600 sentences" in logs[0]  # process 0's progress counts both processes' parts
  assert_same_contents(contents(tmp_path / "two.hdf5"), contents(tmp_path / "one.hdf5"))
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "one.hdf5", "two.hdf5"]


@pytest.mark.slow
def test_cli_devices_and_cluster_errors_are_one_line(tmp_path):
  text = write_lines(tmp_path / "in.txt", LINES[:2])
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={text}",
                         f"--output_file={tmp_path / 'o.hdf5'}", "--devices=4"], env=env(devices=2),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert error_lines(proc.stderr) == ["error: devices=4: this process has 2 local devices (cpu)"]
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={text}",
                         f"--output_file={tmp_path / 'o.hdf5'}", "--coordinator_address=127.0.0.1:1"], env=env(),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert error_lines(proc.stderr) == ["error: --coordinator_address needs --num_processes and --process_id too"]
  assert os.listdir(tmp_path) == ["in.txt"]
