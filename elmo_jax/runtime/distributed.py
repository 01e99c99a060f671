"""Multi-process setup (`jax.distributed`) and preemption signals that every process agrees on."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import jax
import numpy as np

from elmo_jax.runtime import log, watchdog

# Environment variables whose presence means a cluster launcher that `jax.distributed.initialize()` can read
# without arguments (SLURM, Open MPI, TPU VMs / pods, Kubernetes JobSet via the coordinator variable).
_AUTO_ENV = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS")
DEFAULT_TIMEOUT_S = 300  # JAX's own: the VMs of a pod slice may start minutes apart
NOTICE_AFTER_S = 3.0  # processes started together connect within a second; later than this, say who is missing


def initialize(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, command: str = "train") -> bool:
  """Calls `jax.distributed.initialize` when this is a multi-process run; True if it did.

  Args:
    mode: "off" never initializes; "on" always does (with whatever arguments were given, JAX detects the
      rest); "auto" does when `coordinator_address` is given or a cluster environment is detected.
    coordinator_address, num_processes, process_id: explicit cluster description (all three, e.g. for
      processes started by hand on one or several machines).
    timeout_s: how long to wait for every process to connect (`--distributed_timeout_s`). After
      NOTICE_AFTER_S seconds a line says what this process waits for; at the timeout the process ends with
      one line `COMMAND: error: ...` and exit code 1 (JAX's own timeout aborts with a C++ stack trace).
  """
  if mode not in ("auto", "on", "off"):
    raise ValueError(f"--distributed must be 'auto', 'on' or 'off', got {mode!r}")
  if not timeout_s > 0:
    raise ValueError(f"--distributed_timeout_s must be > 0, got {timeout_s}")
  explicit = coordinator_address is not None
  if explicit and (num_processes is None or process_id is None):
    raise ValueError("--coordinator_address needs --num_processes and --process_id too")
  if mode == "off" or (mode == "auto" and not explicit and not any(v in os.environ for v in _AUTO_ENV)):
    return False
  if explicit and num_processes == 1:
    return False
  # Must be set before the backend starts: cross-process collectives of the CPU backend go through gloo
  # (jax 0.10's default, set anyway so an older default of "none" cannot fail the first all-reduce). It only
  # concerns the CPU client, so it is harmless on GPU/TPU hosts.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs: dict[str, Any] = {}
  if explicit:
    kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id)
  waiting = _waiting_for(coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS"), num_processes,
                        process_id)
  started = time.monotonic()
  cancel = watchdog.exit_after(
      timeout_s, f"{command}: error: gave up after {timeout_s:g}s (--distributed_timeout_s): {waiting}; start "
      "every process with the same --coordinator_address and --num_processes, each with its own --process_id",
      notice_after_s=NOTICE_AFTER_S, notice=f"{command}: {waiting} (gives up after {timeout_s:g}s: "
      "--distributed_timeout_s)", name="distributed-initialize")
  # JAX's own deadline comes later, so that ours is the one that ends a wait.
  jax.distributed.initialize(**kwargs, initialization_timeout=int(timeout_s) + 60)
  if cancel():
    log.info(f"{command}: all {jax.process_count()} processes connected after {time.monotonic() - started:.0f}s",
             all_processes=True)
  return True


def _waiting_for(address: str | None, num_processes: int | None, process_id: int | None) -> str:
  """What `jax.distributed.initialize` waits for, from this process's side: its coordinator (process 0 hosts
  it), and the other process ids (the coordinator does not tell which of them have connected)."""
  where = f"the coordinator at {address}" if address else "the cluster's coordinator (found by JAX)"
  if num_processes is None or process_id is None:
    return f"this process waits at {where} for every process of the cluster to connect"
  others = [i for i in range(num_processes) if i != process_id]
  ids = ", ".join(map(str, others)) if len(others) <= 8 else f"{', '.join(map(str, others[:4]))}, ..., {others[-1]}"
  missing = f"process {ids}" if len(others) == 1 else f"processes {ids} (whichever have not started)"
  if process_id == 0:
    return f"process 0 of {num_processes} hosts {where} and waits for {missing} to connect"
  return f"process {process_id} of {num_processes} waits at {where} (hosted by process 0) for {missing} to connect"


def any_process(flag: bool) -> bool:
  """True on every process if `flag` is true on any; a tiny all-gather when there are several processes."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.array([flag], np.int32))))


class StopRequest:
  """SIGTERM / SIGINT -> finish the current step, save and exit; a second SIGINT interrupts at once.

  `requested()` must be called by every process at the same step: a preemption signal may reach the hosts
  of a pod at different steps, and all of them have to take part in the same final checkpoint.
  """

  def __init__(self):
    self.signal_name: str | None = None
    self._previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers only install there
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame) -> None:
    if self.signal_name == "SIGINT" and signum == signal.SIGINT:
      # Second Ctrl-C: the user does not want to wait for the save. Not a KeyboardInterrupt: raised in
      # whatever Python code runs now (an Orbax finalizer, a weakref callback), it can be swallowed ("Exception
      # ignored in ..."). A save cut short stays a temporary folder; the newest finished checkpoint resumes.
      os.write(2, b"train: second interrupt: stopped without finishing the save; rerun resumes from the "
                  b"last finished checkpoint\n")
      os._exit(130)
    self.signal_name = signal.Signals(signum).name

  def requested(self) -> bool:
    return any_process(self.signal_name is not None)

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
