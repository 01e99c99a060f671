"""Runs that must stop in one line, within a stated time, instead of hanging (issue 34, faults 4 and 8).

The module's runs: three train.py processes at once (one launch each): a local run whose `checkpoints/`
folder is replaced by a file after its first save, a bucket run whose bucket stops answering after its first save (its
fake-gcs-server paused with SIGSTOP, as a network partition does), and process 0 of a two-process run whose
partner is never started. The first two pause themselves after step 2 is saved (tests/signal_train.py,
`2:STOP`), so the fault lands at a known point. Then a two-process run whose save fails on process 0.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

import gcs_util
import launch_util
from elmo_jax.runtime import storage
from elmo_jax.training.checkpoint import Checkpointer

pytestmark = pytest.mark.slow  # subprocess runs of train.py

STEPS, EVERY = 8, 2
SAVE_TIMEOUT_S = 20  # config.checkpoint_timeout_s of the runs
DIST_TIMEOUT_S = 15  # --distributed_timeout_s of the lone process
WAITING = "train: process 0 of 2 hosts the coordinator at 127.0.0.1:{port} and waits for process 1 to connect"


class Clock:
  """Polls until a condition holds, noting meanwhile when the lone process printed its waiting line."""

  def __init__(self, alone_log: str | None = None):
    self.alone_log, self.noticed_at = alone_log, None

  def until(self, condition, timeout: float, what: str) -> float:
    deadline = time.time() + timeout
    while True:
      if self.alone_log and self.noticed_at is None and "waits for process 1" in launch_util.read(self.alone_log):
        self.noticed_at = time.time()
      if condition():
        return time.time()
      assert time.time() < deadline, f"timed out waiting for {what}"
      time.sleep(0.1)


def _paused(proc) -> bool:
  with open(f"/proc/{proc.pid}/stat") as f:
    return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _newest_good_step(directory: str) -> int | None:
  """The step a rerun resumes from: the newest that verifies and whose meta item Orbax restores."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  ckpt = Checkpointer(directory, read_only=True)
  load = lambda step: ckpt.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  found = ckpt.restore_newest(load, verified_must_load=False)
  assert found is None or ckpt.verify(found[0]) is None and found[1]["data"]
  return None if found is None else found[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("stuck"))
  emulator = gcs_util.start()  # this test's own server: it is paused
  try:
    with pytest.MonkeyPatch.context() as mp:
      # No lock heartbeat during the runs (its retry warnings are not what is tested here).
      for key, value in {**emulator.env, "ELMO_JAX_CACHE": os.path.join(root, "cache"),
                         "ELMO_JAX_LOCK_LEASE_S": "3600"}.items():
        mp.setenv(key, value)
      yield _run_all(root, emulator)
  finally:
    emulator.process.send_signal(signal.SIGCONT)
    emulator.stop()


def _run_all(root: str, emulator) -> dict:
  train = launch_util.write_corpus(os.path.join(root, "train.txt"))
  config = launch_util.write_config(os.path.join(root, "tiny.py"), train, num_train_steps=STEPS,
                                    checkpoint_every_steps=EVERY, log_every_steps=1,
                                    checkpoint_timeout_s=float(SAVE_TIMEOUT_S))
  local, remote = os.path.join(root, "local"), emulator.new_bucket() + "/run"
  logs = {name: os.path.join(root, f"{name}.log") for name in ("alone", "local", "remote")}
  port = launch_util.free_port()
  started = time.time()
  procs = {"alone": launch_util.launch(os.path.join(root, "alone"), config, f"--coordinator_address=127.0.0.1:{port}",
                                       "--num_processes=2", "--process_id=0",
                                       f"--distributed_timeout_s={DIST_TIMEOUT_S}", log=logs["alone"]),
           "local": launch_util.launch(local, config, log=logs["local"], signal_at="2:STOP"),
           "remote": launch_util.launch(remote, config, log=logs["remote"], signal_at="2:STOP")}
  clock, faulted, ended = Clock(logs["alone"]), {}, {}
  try:
    clock.until(lambda: _paused(procs["local"]), 300, "the local run to pause after step 2")
    checkpoints = os.path.join(local, "checkpoints")
    os.rename(checkpoints, checkpoints + ".kept")  # the disk's folder is gone: every later save fails
    open(checkpoints, "w").close()
    faulted["local"] = time.time()
    procs["local"].send_signal(signal.SIGCONT)
    clock.until(lambda: _paused(procs["remote"]), 300, "the bucket run to pause after step 2")
    emulator.process.send_signal(signal.SIGSTOP)  # the bucket stops answering (connections hang)
    faulted["remote"] = time.time()
    procs["remote"].send_signal(signal.SIGCONT)
    for name in ("local", "remote", "alone"):
      ended[name] = clock.until(lambda: procs[name].poll() is not None, SAVE_TIMEOUT_S + 120, f"{name} to exit")
  finally:
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()
    emulator.process.send_signal(signal.SIGCONT)
  return {"codes": {name: proc.returncode for name, proc in procs.items()}, "started": started,
          "faulted": faulted, "ended": ended, "noticed": clock.noticed_at, "port": port, "local": local,
          "remote": remote, "logs": {name: launch_util.read(path) for name, path in logs.items()}}


def _error_lines(text: str) -> list[str]:
  return [line for line in text.splitlines() if "error" in line.lower() or "Traceback" in line]


def test_a_save_that_fails_stops_the_run_in_one_line_keeping_the_last_checkpoint(runs):
  log = runs["logs"]["local"]
  assert runs["codes"]["local"] == 1, log[-3000:]
  assert _error_lines(log) == [
      f"train: error: checkpoint step 4 could not be saved to {runs['local']}/checkpoints (NotADirectoryError: "
      f"[Errno 20] Not a directory: '{runs['local']}/checkpoints/checksums'); stopped. Rerunning the same command "
      "resumes from step 2, the last finished checkpoint"], log[-3000:]
  assert "step 4/8" in log and "step 5/8" not in log  # stopped at the step whose save failed
  assert runs["ended"]["local"] - runs["faulted"]["local"] < SAVE_TIMEOUT_S  # a failure needs no deadline
  assert _newest_good_step(os.path.join(runs["local"], "checkpoints.kept")) == 2
  assert not os.path.exists(os.path.join(runs["local"], "train.lock"))  # released


def test_a_bucket_that_stops_answering_ends_the_run_at_the_save_deadline(runs):
  log = runs["logs"]["remote"]
  assert runs["codes"]["remote"] == 1, log[-3000:]
  assert _error_lines(log) == [
      f"train: error: checkpoint step 4 was not saved to {runs['remote']}/checkpoints within {SAVE_TIMEOUT_S}s "
      "(config.checkpoint_timeout_s): the disk or bucket does not answer; stopped. Rerunning the same command "
      "resumes from step 2, the last finished checkpoint"], log[-3000:]
  took = runs["ended"]["remote"] - runs["faulted"]["remote"]
  assert SAVE_TIMEOUT_S <= took < SAVE_TIMEOUT_S + 30, took
  assert _newest_good_step(storage.join(runs["remote"], "checkpoints")) == 2  # the bucket answers again


def test_a_process_whose_partner_never_starts_says_what_it_waits_for_and_gives_up(runs):
  log = runs["logs"]["alone"]
  assert runs["codes"]["alone"] == 1, log[-3000:]
  waiting = WAITING.format(port=runs["port"])
  assert log.splitlines()[-2:] == [
      f"{waiting} (gives up after {DIST_TIMEOUT_S}s: --distributed_timeout_s)",
      f"train: error: gave up after {DIST_TIMEOUT_S}s (--distributed_timeout_s): {waiting.removeprefix('train: ')}; "
      "start every process with the same --coordinator_address and --num_processes, each with its own --process_id"]
  assert "Check failure" not in log and "Traceback" not in log
  # Said early (3 s into the wait), given up at the timeout, not JAX's 300 s.
  assert runs["ended"]["alone"] - runs["noticed"] >= DIST_TIMEOUT_S - 3 - 2
  assert runs["ended"]["alone"] - runs["started"] < DIST_TIMEOUT_S + 90
  assert not os.path.exists(os.path.join(os.path.dirname(runs["local"]), "alone", "config.json"))


def test_the_deadlines_are_checked_before_anything_runs(tmp_path):
  from elmo_jax.training import distributed, preflight  # pylint: disable=g-import-not-at-top
  import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.train_config(launch_util.write_corpus(str(tmp_path / "train.txt")), checkpoint_timeout_s=0.0)
  with pytest.raises(preflight.PreflightError, match=r"^config\.checkpoint_timeout_s=0\.0: must be > 0$"):
    preflight.check_values(config)
  with pytest.raises(ValueError, match=r"^--distributed_timeout_s must be > 0, got -1$"):
    distributed.initialize("on", "127.0.0.1:1", 2, 0, timeout_s=-1)


def test_a_save_that_fails_on_a_pod_ends_every_process_at_the_deadline(tmp_path):
  """Two processes: Orbax's saves meet at barriers, so process 0's failed save leaves both waiting; the
  deadline ends both, each with one line, and the last good checkpoint stays."""
  train = launch_util.write_corpus(str(tmp_path / "train.txt"))
  config = launch_util.write_config(str(tmp_path / "tiny.py"), train, num_train_steps=STEPS,
                                    checkpoint_every_steps=EVERY, log_every_steps=1,
                                    checkpoint_timeout_s=float(SAVE_TIMEOUT_S))
  workdir, port = str(tmp_path / "run"), launch_util.free_port()
  procs = [launch_util.launch(workdir, config, "--config.data.shard=rows", f"--coordinator_address=127.0.0.1:{port}",
                              "--num_processes=2", f"--process_id={i}", log=str(tmp_path / f"p{i}.log"),
                              signal_at="2:STOP" if i == 0 else None) for i in range(2)]
  try:
    Clock().until(lambda: _paused(procs[0]), 300, "process 0 to pause after step 2")
    os.rename(f"{workdir}/checkpoints", f"{workdir}/checkpoints.kept")
    open(f"{workdir}/checkpoints", "w").close()
    faulted = time.time()
    procs[0].send_signal(signal.SIGCONT)
    codes = launch_util.wait(procs, SAVE_TIMEOUT_S + 120)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  took = time.time() - faulted
  logs = [launch_util.read(str(tmp_path / f"p{i}.log")) for i in range(2)]
  assert codes == [1, 1], "\n".join(log[-2000:] for log in logs)
  assert SAVE_TIMEOUT_S <= took < SAVE_TIMEOUT_S + 30, took
  for log in logs:
    assert _error_lines(log) == [
        f"train: error: checkpoint step 4 was not saved to {workdir}/checkpoints within {SAVE_TIMEOUT_S}s "
        "(config.checkpoint_timeout_s): the disk or bucket does not answer, or a save failed on another "
        "process; stopped. Rerunning the same command resumes from step 2, the last finished checkpoint"], log
  assert _newest_good_step(f"{workdir}/checkpoints.kept") == 2
