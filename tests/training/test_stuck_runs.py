"""Runs that must stop in one line, within a stated time, instead of hanging (issue 34, faults 4 and 8).

The module's runs: five train.py processes at once (one launch each): a local run whose `checkpoints/`
folder is replaced by a file after its first save, a bucket run whose bucket stops answering after its first save (its
fake-gcs-server paused with SIGSTOP, as a network partition does), and process 0 of a two-process run whose
partner is never started; and alongside them a two-process run whose save fails on process 0. The local, bucket and
pod runs pause themselves after step 2 is saved (tests/signal_train.py, `2:STOP`), so the fault lands at a known
point; each is faulted as soon as it pauses. The deadlines are wall time: run at once, they are waited out once.
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


def _break_checkpoints(workdir: str) -> None:
  """The disk's checkpoints/ folder is gone (kept aside as checkpoints.kept), a file in its place: every later
  save fails."""
  os.rename(os.path.join(workdir, "checkpoints"), os.path.join(workdir, "checkpoints.kept"))
  open(os.path.join(workdir, "checkpoints"), "w").close()


def _run_all(root: str, emulator) -> dict:
  train = launch_util.write_corpus(os.path.join(root, "train.txt"))
  config = launch_util.write_config(os.path.join(root, "tiny.py"), train, num_train_steps=STEPS,
                                    checkpoint_every_steps=EVERY, log_every_steps=1,
                                    checkpoint_timeout_s=float(SAVE_TIMEOUT_S))
  local, remote, pod = os.path.join(root, "local"), emulator.new_bucket() + "/run", os.path.join(root, "pod")
  logs = {name: os.path.join(root, f"{name}.log") for name in ("alone", "local", "remote", "pod0", "pod1")}
  port, pod_port = launch_util.free_port(), launch_util.free_port()
  started = time.time()
  procs = {"alone": launch_util.launch(os.path.join(root, "alone"), config, f"--coordinator_address=127.0.0.1:{port}",
                                       "--num_processes=2", "--process_id=0",
                                       f"--distributed_timeout_s={DIST_TIMEOUT_S}", log=logs["alone"]),
           "local": launch_util.launch(local, config, log=logs["local"], signal_at="2:STOP"),
           "remote": launch_util.launch(remote, config, log=logs["remote"], signal_at="2:STOP"),
           **{f"pod{i}": launch_util.launch(pod, config, "--config.data.shard=rows",
                                            f"--coordinator_address=127.0.0.1:{pod_port}", "--num_processes=2",
                                            f"--process_id={i}", log=logs[f"pod{i}"],
                                            signal_at="2:STOP" if i == 0 else None) for i in range(2)}}

  def stop_bucket():
    emulator.process.send_signal(signal.SIGSTOP)  # the bucket stops answering (connections hang)
  # Each paused run's fault, applied as soon as it pauses (a paused pod process holds its partner up).
  faults = {"local": lambda: _break_checkpoints(local), "remote": stop_bucket, "pod0": lambda: _break_checkpoints(pod)}
  clock, faulted, ended = Clock(logs["alone"]), {}, {}

  def poll() -> bool:  # notes each exit when it happens, faults each run when it pauses; True once all exited
    for name, proc in procs.items():
      if name not in ended and proc.poll() is not None:
        ended[name] = time.time()
    for name in [n for n in faults if n not in ended and _paused(procs[n])]:
      faults.pop(name)()
      faulted[name] = time.time()
      procs[name].send_signal(signal.SIGCONT)
    return len(ended) == len(procs)
  try:
    clock.until(poll, 300 + SAVE_TIMEOUT_S + 120, "every run to pause after step 2, be faulted and exit")
  finally:
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()
    emulator.process.send_signal(signal.SIGCONT)
  return {"codes": {name: proc.returncode for name, proc in procs.items()}, "started": started,
          "faulted": faulted, "ended": ended, "noticed": clock.noticed_at, "port": port, "local": local,
          "remote": remote, "pod": pod, "logs": {name: launch_util.read(path) for name, path in logs.items()}}


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
  from elmo_jax.runtime import distributed  # pylint: disable=g-import-not-at-top
  from elmo_jax.training import preflight  # pylint: disable=g-import-not-at-top
  import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.train_config(launch_util.write_corpus(str(tmp_path / "train.txt")), checkpoint_timeout_s=0.0)
  with pytest.raises(preflight.PreflightError, match=r"^config\.checkpoint_timeout_s=0\.0: must be > 0$"):
    preflight.check_values(config)
  with pytest.raises(ValueError, match=r"^--distributed_timeout_s must be > 0, got -1$"):
    distributed.initialize("on", "127.0.0.1:1", 2, 0, timeout_s=-1)


def test_a_save_that_fails_on_a_pod_ends_every_process_at_the_deadline(runs):
  """Two processes: Orbax's saves meet at barriers, so process 0's failed save leaves both waiting; the
  deadline ends both, each with one line, and the last good checkpoint stays."""
  logs, pod = [runs["logs"][f"pod{i}"] for i in range(2)], runs["pod"]
  assert [runs["codes"]["pod0"], runs["codes"]["pod1"]] == [1, 1], "\n".join(log[-2000:] for log in logs)
  took = max(runs["ended"]["pod0"], runs["ended"]["pod1"]) - runs["faulted"]["pod0"]
  assert SAVE_TIMEOUT_S <= took < SAVE_TIMEOUT_S + 30, took
  for log in logs:
    assert _error_lines(log) == [
        f"train: error: checkpoint step 4 was not saved to {pod}/checkpoints within {SAVE_TIMEOUT_S}s "
        "(config.checkpoint_timeout_s): the disk or bucket does not answer, or a save failed on another "
        "process; stopped. Rerunning the same command resumes from step 2, the last finished checkpoint"], log
  assert _newest_good_step(f"{pod}/checkpoints.kept") == 2
