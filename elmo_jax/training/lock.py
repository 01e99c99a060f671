"""One trainer per workdir, held by process 0: an exclusive `flock` on WORKDIR/train.lock, or for a bucket
workdir an object `train.lock` created only if absent (a generation precondition) and kept alive by a
heartbeat.

The kernel drops a flock when its holder exits, however it exits (kill -9 included), so a lock file left by a
dead trainer is stale and simply taken over (`runtime/lock.FileLock`); the file only records who holds it. A bucket
cannot tell that its writer died: the lock object is rewritten every `lease/4` seconds, and one not rewritten
for `lease` seconds ($ELMO_JAX_LOCK_LEASE_S, default 120) is taken over, as is at once one whose holder was a
process of this machine that no longer runs (a rerun after kill -9 or a preemption of the same VM).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from elmo_jax.runtime import lock as file_lock
from elmo_jax.runtime import log
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import LOCK_FILE


class WorkdirLocked(RuntimeError):
  """Another live trainer holds the workdir; the message names it."""


class WorkdirLock:
  """Use `WorkdirLock.acquire(workdir)`; `release()` (idempotent) when the run ends."""

  def __init__(self, held: file_lock.FileLock | None):
    self.path, self._held = (held.path if held else None), held

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
      return cls(None)
    if storage.is_remote(workdir):
      return BucketLock.acquire(workdir)
    os.makedirs(workdir, exist_ok=True)
    try:
      return cls(file_lock.FileLock.acquire(os.path.join(workdir, LOCK_FILE)))
    except file_lock.Held as e:
      raise WorkdirLocked(f"{os.path.abspath(workdir)} is in use by another trainer ({e.holder}); wait for it to "
                          f"finish or stop it, or give another --workdir") from None

  def release(self) -> None:
    if self._held is not None:
      self._held.release()


def _record() -> bytes:
  return file_lock.record()


def _describe(record: bytes) -> str:
  return file_lock.describe(record, LOCK_FILE)


def lease_seconds() -> float:
  return float(os.environ.get("ELMO_JAX_LOCK_LEASE_S") or 120)


def _gone_from_this_machine(record: bytes) -> bool:
  """The holder was a process of this machine that no longer runs."""
  try:
    info = json.loads(record.decode())
    if info.get("host") != socket.gethostname():
      return False
    os.kill(int(info["pid"]), 0)
    return False
  except ProcessLookupError:
    return True
  except (ValueError, KeyError, TypeError, UnicodeDecodeError, PermissionError):
    return False


class BucketLock:
  """The bucket workdir's lock object; `release()` (idempotent) stops the heartbeat and deletes it."""

  def __init__(self, blob, url: str, record: bytes):
    self._blob, self.path, self._record = blob, url, record  # the same record at every beat
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._heartbeat, daemon=True, name="workdir-lock-heartbeat")
    self._thread.start()

  @classmethod
  def acquire(cls, workdir: str) -> "BucketLock":
    """Raises WorkdirLocked (held by a live trainer), StorageError (the bucket refused; one line)."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    try:
      return cls._acquire(workdir)
    except exceptions.GoogleAPIError as e:
      raise storage.StorageError(f"{workdir}: locking it failed ({type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:200]})") from None

  @classmethod
  def _acquire(cls, workdir: str) -> "BucketLock":
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top
    url = storage.join(workdir, LOCK_FILE)
    bucket, _, name = url[len(storage.SCHEME):].partition("/")
    blob = gcs.Client().bucket(bucket).blob(name)
    mine = _record()
    try:
      blob.upload_from_string(mine, if_generation_match=0)  # only if no lock object exists
      return cls(blob, url, mine)
    except exceptions.PreconditionFailed:
      pass
    held = blob.bucket.get_blob(name)
    if held is None:  # released in between: try once more
      return cls._acquire(workdir)
    record = held.download_as_bytes()
    age = time.time() - held.updated.timestamp()
    lease = lease_seconds()
    if age < lease and not _gone_from_this_machine(record):
      raise WorkdirLocked(f"{workdir} is in use by another trainer ({_describe(record)}; last heartbeat "
                          f"{age:.0f}s ago); wait for it to finish or stop it, or give another --workdir "
                          f"(a holder that died is taken over {lease:.0f}s after its last heartbeat)")
    try:  # stale: replaced only if nobody replaced it since we read it
      blob.upload_from_string(mine, if_generation_match=held.generation)
    except exceptions.PreconditionFailed:
      raise WorkdirLocked(f"{workdir}: another trainer took over its stale lock just now; give another "
                          "--workdir or stop that one") from None
    log.info(f"took over the stale lock of {workdir} ({_describe(record)}; last heartbeat {age:.0f}s ago)")
    return cls(blob, url, mine)

  def _heartbeat(self) -> None:
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    while not self._stop.wait(lease_seconds() / 4):
      try:
        self._blob.upload_from_string(self._record, if_generation_match=self._blob.generation)
      except exceptions.PreconditionFailed:
        log.info(f"warning: lost the workdir lock {self.path}: another trainer took it over (this one's "
                 "heartbeat was late by more than the lease); stop one of them")
        return
      except Exception as e:  # noqa: BLE001 - a network blip: the next beat tries again
        log.info(f"warning: workdir lock heartbeat failed ({type(e).__name__}); retrying")

  def release(self) -> None:
    if self._stop.is_set():
      return
    self._stop.set()
    self._thread.join(timeout=5)  # a beat stuck on an unanswering bucket is left behind (a daemon thread)
    try:  # not a lock someone took over; bounded: a run stopping because the bucket does not answer ends
      self._blob.delete(if_generation_match=self._blob.generation, timeout=10, retry=None)
    except Exception:  # noqa: BLE001 - already gone, or taken over: nothing of ours to remove
      pass
