"""One trainer per workdir: an exclusive `flock` on WORKDIR/train.lock, held by process 0.

The kernel drops the lock when its holder exits, however it exits (kill -9 included), so a lock file left
by a dead trainer is stale and simply taken over; the file only records who holds it, for the message.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time

LOCK_FILE = "train.lock"


class WorkdirLocked(RuntimeError):
  """Another live trainer holds the workdir; the message names it."""


class WorkdirLock:
  """Use `WorkdirLock.acquire(workdir)`; `release()` (idempotent) when the run ends."""

  def __init__(self, path: str | None, fd: int | None):
    self.path, self._fd = path, fd

  @classmethod
  def acquire(cls, workdir: str, process_index: int | None = None) -> "WorkdirLock":
    """Locks `workdir` (creating it) on process 0; other processes get a no-op lock.

    Raises:
      WorkdirLocked: another live process holds it (nothing was written).
    """
    if process_index is None:
      import jax  # pylint: disable=g-import-not-at-top
      process_index = jax.process_index()
    if process_index != 0:
      return cls(None, None)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = _describe(os.read(fd, 4096))
      os.close(fd)
      raise WorkdirLocked(f"{os.path.abspath(workdir)} is in use by another trainer ({holder}); wait for it to "
                          f"finish or stop it, or give another --workdir") from None
    os.ftruncate(fd, 0)  # a stale record of a dead holder
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
    os.fsync(fd)
    return cls(path, fd)

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.remove(self.path)  # while still locked, so no other trainer's fresh lock file is removed
    except OSError:
      pass
    os.close(self._fd)
    self._fd = None


def _describe(record: bytes) -> str:
  try:
    info = json.loads(record.decode())
    return f"pid {info['pid']} on {info['host']}, started {info['started']}"
  except (ValueError, KeyError, UnicodeDecodeError):
    return "lock file " + LOCK_FILE
