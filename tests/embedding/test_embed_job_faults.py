"""The embedding job's faults (issue 34): parts checked against their records, a full disk or file-size limit,
two commands on one output, and the command's numbers bounded.

The reference of every resumed job: the uninterrupted run's file, equal bit for bit (both go through the same
parts, see test_embed_parallel.py).
"""
from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import namedtuple

import h5py
import pytest

from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding import space
from elmo_jax.embedding import writer as embed
from elmo_jax.embedding.embedder import Embedder
from embed_util import (SENTENCES, assert_same_contents, contents, error_lines, model_args, stop_at_launch,
                        write_lines)
from launch_util import env
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS

LINES = [s for group in SENTENCES for s in group]  # 30 fixture sentences, lengths 1-22
KW = dict(batch_size=4, part_sentences=4, progress_every=None)  # 8 parts of one batch


@pytest.fixture(scope="module")
def embedder() -> Embedder:
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)


def interrupted(embedder, monkeypatch, text: str, out, launches: int = 6, **kwargs) -> embed_job.Job:
  """A job stopped at the embedder's `launches`-th batch: `launches - 2` committed parts."""
  stop_at_launch(monkeypatch, embedder, launches)
  with pytest.raises(KeyboardInterrupt):
    embed.embed_file(embedder, text, out, **{**KW, **kwargs})
  monkeypatch.undo()
  return embed_job.Job(str(out))


def test_changed_truncated_or_copied_parts_are_set_aside_and_embedded_again(tmp_path, embedder, monkeypatch):
  text = write_lines(tmp_path / "in.txt", LINES)
  embed.embed_file(embedder, text, tmp_path / "whole.hdf5", **KW)
  out = tmp_path / "out.hdf5"
  job = interrupted(embedder, monkeypatch, text, out)
  parts = job.parts_dir
  assert sorted(os.listdir(parts))[:8] == [f"000000-000{g}.{e}" for g in range(4) for e in ("hdf5", "json")]
  with h5py.File(os.path.join(parts, "000000-0000.hdf5"), "r+") as f:  # same size, other values
    name = next(iter(f))
    f[name][...] = 0
  with open(os.path.join(parts, "000000-0001.hdf5"), "r+b") as f:
    f.truncate(1000)
  for ext in ("hdf5", "json"):  # part 3 replaced by a copy of part 2 (its record too)
    shutil.copy(os.path.join(parts, f"000000-0002.{ext}"), os.path.join(parts, f"000000-0003.{ext}"))
  warnings: list[str] = []
  stats = embed.embed_file(embedder, text, out, **KW, warn=warnings.append)
  bad = str(out) + ".bad-parts"
  said = [w for w in warnings if "set aside" in w]
  assert said == [
      f"{parts}/000000-0000.hdf5: its sha256 differs from its record (changed since it was written); set aside in "
      f"{bad}, embedding it again",
      f"{parts}/000000-0001.hdf5: 1000 bytes where its record says "
      f"{json.load(open(os.path.join(bad, '000000-0001.json')))['bytes']} (truncated or changed since it was "
      f"written); set aside in {bad}, embedding it again",
      f"{parts}/000000-0003.hdf5: its record is part 000000-0002's (copied from another part?); set aside in "
      f"{bad}, embedding it again"], warnings
  assert stats["resumed"] == 4 and stats["sentences"] == len(LINES) - 4  # only part 2 was kept
  assert_same_contents(contents(out), contents(tmp_path / "whole.hdf5"))
  assert sorted(os.listdir(bad)) == [f"000000-000{g}.{e}" for g in (0, 1, 3) for e in ("hdf5", "json")]  # kept
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5", "out.hdf5.bad-parts", "whole.hdf5"]


def test_dataset_names_that_clash_are_refused_before_the_merge(tmp_path, embedder, monkeypatch):
  text = write_lines(tmp_path / "in.txt", LINES)
  out = tmp_path / "out.hdf5"
  job = interrupted(embedder, monkeypatch, text, out, launches=4)
  record = os.path.join(job.parts_dir, "000000-0001.json")
  with open(record) as f:
    meta = json.load(f)
  first = json.load(open(os.path.join(job.parts_dir, "000000-0000.json")))["keys"][0]
  with open(record, "w") as f:  # a record naming a dataset part 0 holds (its data still matches its sha256)
    json.dump({**meta, "keys": meta["keys"] + [first]}, f)
  with pytest.raises(embed_job.JobError, match=rf"^{job.folder}: parts 000000-0000 and 000000-0001 both hold "
                                               rf"dataset '{first}'; the merge cannot write both"):
    embed.embed_file(embedder, text, out, **KW)
  assert not out.exists() and os.path.isdir(job.folder)
  # `x` beside `x/y z` (h5py makes x a group): refused before any work, naming both lines
  keyed = write_lines(tmp_path / "keys.txt", ["x/y z", LINES[0], "x"])
  with pytest.raises(embed.EmbedInputError, match=r"keys.txt:3: 'x' cannot name an HDF5 dataset beside line 1's "
                                                  r"'x/y z' \('/' makes one a group of the other\)"):
    embed.embed_file(embedder, keyed, tmp_path / "keyed.hdf5", use_sentence_keys=True, progress_every=None)
  assert not (tmp_path / "keyed.hdf5.partial").exists()


def test_no_space_is_one_line_with_the_space_needed_and_resumes(tmp_path, embedder, monkeypatch):
  """ENOSPC while a part is written and before the merge (the disk's free space faked; the file-size limit of
  a real process: `test_file_size_limit_...`)."""
  text = write_lines(tmp_path / "in.txt", LINES)
  embed.embed_file(embedder, text, tmp_path / "whole.hdf5", **KW)
  out = tmp_path / "out.hdf5"
  real, calls = embed_job.Job.commit, []

  def full_at_the_third(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
      raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, *args, **kwargs)

  monkeypatch.setattr(embed_job.Job, "commit", full_at_the_third)
  with pytest.raises(space.NoSpaceError) as e:
    embed.embed_file(embedder, text, out, **KW)
  monkeypatch.undo()
  assert str(e.value).startswith(f"{tmp_path}: no space left on the device while writing the parts; the job "
                                 "needs about ") and "of parts still to write, then " in str(e.value)
  assert str(e.value).endswith(f"the finished parts are kept in {out}.partial: make room and rerun the same "
                               "command to resume") and "\n" not in str(e.value)
  parts = sorted(os.listdir(f"{out}.partial/parts"))
  assert parts == ["000000-0000.hdf5", "000000-0000.json", "000000-0001.hdf5", "000000-0001.json"]
  Usage = namedtuple("Usage", "total used free")
  monkeypatch.setattr(space.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
  with pytest.raises(space.NoSpaceError, match=r"no space left on the device while merging the parts; the "
                                               r"job needs about \d+\.\d kB free there for the merged file, "
                                               r"1\.0 kB are free"):
    embed.embed_file(embedder, text, out, **KW)
  monkeypatch.undo()
  assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
  assert embed.embed_file(embedder, text, out, **KW)["resumed"] == len(LINES)
  assert_same_contents(contents(out), contents(tmp_path / "whole.hdf5"))


def _limited(limit: int, args: list[str]) -> list[str]:
  """`args` under a file-size limit of `limit` bytes (the shell's `ulimit -f`, in KiB; no preexec_fn, which
  forks this multithreaded process); the command itself ignores SIGXFSZ, so a write fails (EFBIG)."""
  return ["bash", "-c", f'ulimit -f {limit // 1024} && exec "$@"', "embed", *args]


@pytest.mark.slow
def test_file_size_limit_while_writing_parts_and_merging_is_one_line_and_resumable(tmp_path):
  if not hasattr(resource, "RLIMIT_FSIZE") or shutil.which("bash") is None:
    pytest.skip("no file-size limit (RLIMIT_FSIZE, bash's ulimit -f) here, and no small filesystem to fill")
  text = write_lines(tmp_path / "in.txt", LINES * 20)  # 600 lines: parts of 128 lines up to ~2 MB, 6 MB in all
  args = [sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={text}", "--part_sentences=128",
          "--noprogress"]
  whole, out = tmp_path / "whole.hdf5", tmp_path / "out.hdf5"
  assert subprocess.run(args + [f"--output_file={whole}"], env=env(), capture_output=True, timeout=600).returncode == 0
  size = os.path.getsize(whole)
  for limit, phase in ((256_000, "writing the parts"), (size * 2 // 3, "merging the parts")):
    proc = subprocess.run(_limited(limit, args + [f"--output_file={out}"]), env=env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert line.startswith(f"error: {tmp_path}: a file reached this process's file-size limit (ulimit -f) while "
                           f"{phase}; the merged file will be about "), line
    assert f"the finished parts are kept in {out}.partial: make room and rerun" in line
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5.partial", "whole.hdf5"]  # no output, no temp
    assert not [n for n in os.listdir(f"{out}.partial/parts") if n.endswith(".tmp")]
  assert len(embed_job.Job(str(out)).committed()) == 5  # every part: only the merge was refused
  proc = subprocess.run(args + [f"--output_file={out}"], env=env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and "resumed after 600 in earlier runs" in proc.stderr, proc.stderr[-2000:]
  assert_same_contents(contents(out), contents(whole))


@pytest.mark.slow
def _wait_stopped(pid: int, timeout: float = 30.0) -> None:
  """Until every thread of `pid` is stopped (state T in /proc), so what it has written holds still."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
      try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
          states.append(f.read().rsplit(")", 1)[1].split()[0])
      except FileNotFoundError:  # a thread that just ended
        pass
    if all(s in ("T", "t") for s in states):
      return
    time.sleep(0.01)
  raise AssertionError(f"process {pid} did not stop within {timeout} s")


@pytest.mark.slow
def test_a_second_command_on_a_running_jobs_output_is_refused(tmp_path):
  """Run A paused mid-job, B started on the same output: B is refused in one line and changes nothing; A then
  finishes the file."""
  text = write_lines(tmp_path / "in.txt", LINES * 40)  # 1200 lines, parts of 64
  args = [sys.executable, "-m", "elmo_jax", "embed", *model_args(), f"--input_file={text}",
          f"--output_file={tmp_path / 'out.hdf5'}", "--part_sentences=64", "--noprogress"]
  a = subprocess.Popen(args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  parts = tmp_path / "out.hdf5.partial" / "parts"
  try:
    deadline = time.monotonic() + 300
    while (time.monotonic() < deadline and a.poll() is None
           and not (parts.exists() and any(n.endswith(".json") for n in os.listdir(parts)))):
      time.sleep(0.02)
    a.send_signal(signal.SIGSTOP)
    _wait_stopped(a.pid)  # kill() only queues the signal: A may rename a part before it stops
    before = sorted(os.listdir(parts))
    b = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=300)
    assert sorted(os.listdir(parts)) == before  # B wrote nothing, removed nothing (A's temp file included)
    a.send_signal(signal.SIGCONT)
    err = a.communicate(timeout=600)[1]
  finally:
    a.kill()
  assert b.returncode == 1 and "Traceback" not in b.stderr, b.stderr[-2000:]
  [line] = error_lines(b.stderr)
  assert re.fullmatch(rf"error: {re.escape(str(parts.parent))} is in use by another embed command: pid {a.pid} on "
                      rf"{re.escape(socket.gethostname())}, started [-0-9: ]+; wait for it to finish or stop it, or "
                      r"give another --output_file", line), line
  assert a.returncode == 0 and "wrote" in err, err[-2000:]
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]
  with h5py.File(tmp_path / "out.hdf5", "r") as f:
    assert len(f) == 1201  # every line and sentence_to_index


# Each case through the command's own `main` (its flags defined once): the numbers are checked first.
_NUMBERS = textwrap.dedent("""
    import sys
    from absl import flags
    from elmo_jax.cli import embed
    embed.define_flags()
    for bad in sys.argv[1:]:
      flags.FLAGS.unparse_flags()
      argv = ["embed", "--model=small", "--input_file=in.txt", "--output_file=out.hdf5", bad]
      flags.FLAGS(argv)
      print("rc", embed.main(argv[:1]), flush=True)
""")


def test_numeric_flags_are_bounded_in_one_line(tmp_path, embedder):
  cases = {"--chunk_size=-5": "--chunk_size must be >= 1, got -5",
           "--part_sentences=-3": "--part_sentences must be >= 1, got -3",
           "--progress_every=-1": "--progress_every must be >= 0 (seconds), got -1.0",
           "--progress_every=nan": "--progress_every must be >= 0 (seconds), got nan",
           "--batch_size=0": "--batch_size must be >= 1, got 0", "--devices=0": "--devices must be >= 1, got 0",
           "--num_processes=0": "--num_processes must be >= 1, got 0",
           "--process_id=-1": "--process_id must be >= 0, got -1"}
  proc = subprocess.run([sys.executable, "-c", _NUMBERS, *cases], cwd=tmp_path, env=env(), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == ["rc", "1"] * len(cases)
  assert error_lines(proc.stderr) == [f"error: {message}" for message in cases.values()]
  assert os.listdir(tmp_path) == []
  text = write_lines(tmp_path / "in.txt", LINES[:2])
  for name, value in (("chunk_size", -5), ("part_sentences", -3), ("batch_size", 0)):  # the library's own check
    with pytest.raises(ValueError, match=f"^{name} must be >= 1, got {value}$"):
      embed.embed_file(embedder, text, tmp_path / "o.hdf5", progress_every=None, **{name: value})
  assert os.listdir(tmp_path) == ["in.txt"]
