"""Multi-process setup (`jax.distributed`) and preemption signals that every process agrees on."""
from __future__ import annotations

import os
import signal
import threading
from typing import Any

import jax
import numpy as np

# Environment variables whose presence means a cluster launcher that `jax.distributed.initialize()` can read
# without arguments (SLURM, Open MPI, TPU VMs / pods, Kubernetes JobSet via the coordinator variable).
_AUTO_ENV = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS")


def initialize(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Calls `jax.distributed.initialize` when this is a multi-process run; True if it did.

  Args:
    mode: "off" never initializes; "on" always does (with whatever arguments were given, JAX detects the
      rest); "auto" does when `coordinator_address` is given or a cluster environment is detected.
    coordinator_address, num_processes, process_id: explicit cluster description (all three, e.g. for
      processes started by hand on one or several machines).
  """
  if mode not in ("auto", "on", "off"):
    raise ValueError(f"--distributed must be 'auto', 'on' or 'off', got {mode!r}")
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
  jax.distributed.initialize(**kwargs)
  return True


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
