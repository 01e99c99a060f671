"""An exclusive lock of a folder held by one live process: a `flock` on a file in it that records the holder.

The kernel drops a flock when its holder exits, however it exits (kill -9 included), so a lock file left by a
dead holder is stale and simply taken over; the file only records who holds it (pid, host, start), for the
message of the one refused. Used by the trainer (`training/lock.WorkdirLock`, WORKDIR/train.lock) and the
embedding job (`embedding/job.Job`, OUTPUT.partial/process-P.lock).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time


class Held(RuntimeError):
  """Another live process holds the lock; `holder` says who (`describe`)."""

  def __init__(self, path: str, holder: str):
    super().__init__(f"{path} is held by {holder}")
    self.path, self.holder = path, holder


class FileLock:
  """Use `FileLock.acquire(path)`; `release()` (idempotent) when done."""

  def __init__(self, path: str, fd: int):
    self.path, self._fd = path, fd

  @classmethod
  def acquire(cls, path: str) -> "FileLock":
    """Locks `path` (creating the file, not its folder), writing this process's record into it.

    Raises:
      Held: another live process holds it (the file is left as it was).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = describe(os.read(fd, 4096), os.path.basename(path))
      os.close(fd)
      raise Held(path, holder) from None
    os.ftruncate(fd, 0)  # a stale record of a dead holder
    os.write(fd, record())
    os.fsync(fd)
    return cls(path, fd)

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.remove(self.path)  # while still locked, so no other holder's fresh lock file is removed
    except OSError:
      pass
    os.close(self._fd)
    self._fd = None


def record() -> bytes:
  """Who holds a lock: this process (pid, host, start time) as JSON."""
  return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                     "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()


def describe(held: bytes, name: str) -> str:
  """A `record` for a message: 'pid P on HOST, started T' ('lock file NAME' when it cannot be read)."""
  try:
    info = json.loads(held.decode())
    return f"pid {info['pid']} on {info['host']}, started {info['started']}"
  except (ValueError, KeyError, UnicodeDecodeError):
    return "lock file " + name
