"""A run's workdir, local or in a bucket (`--workdir=gs://bucket/run`, as TPU pod runs keep it).

Every file of the run is written to `local` first. For a local workdir that is the workdir itself and
`push`/`pull` do nothing. For a bucket workdir `local` is a copy in `$ELMO_JAX_CACHE/bucket/` that process 0
writes (`mirror.Mirror`): `push(names)` uploads the files that changed, each as one object, after every
write of the loop (metrics and TensorBoard at log and eval steps, the export and config at saves); `pull()`
makes the copy the bucket's at the start, so a resumed run rewinds the bucket's `metrics.jsonl`, not a
local file a killed run wrote after its last upload. Checkpoints are not copied: Orbax writes
`checkpoints/` in the bucket itself, and the lock is an object there (`training/lock.py`).
"""
from __future__ import annotations

import os
import threading

from elmo_jax.runtime import log
from elmo_jax.runtime import mirror
from elmo_jax.runtime import storage

from elmo_jax.runtime.run_layout import BUCKET_ONLY, CHECKPOINTS


class Workdir:
  """`path` as the user gave it (absolute when local), `local` (where files are written), `checkpoints`."""

  def __init__(self, path: str | os.PathLike):
    text = os.fspath(path)
    self.remote = storage.is_remote(text)
    self.path = text.rstrip("/") if self.remote else os.path.abspath(text)
    self.local = storage.copy_path(self.path, "workdirs") if self.remote else self.path
    self.checkpoints = storage.join(self.path, CHECKPOINTS)
    self._mirror = mirror.Mirror(self.path, self.local, skip=BUCKET_ONLY) if self.remote else None
    self._wake = threading.Condition()
    self._pending: set[str] = set()
    self._busy, self._error, self._uploader = False, None, None
    self._stuck = False  # a flush timed out: the upload thread hangs; nothing waits for it again

  @classmethod
  def of(cls, workdir: "str | os.PathLike | Workdir") -> "Workdir":
    return workdir if isinstance(workdir, Workdir) else cls(workdir)

  def __str__(self) -> str:
    return self.path

  def pull(self, *names: str) -> None:
    """The bucket's files (`names`, default all but checkpoints and the lock) into `local`."""
    if self._mirror is not None:
      self._mirror.pull(*names)

  def push(self, *names: str) -> None:
    """Uploads the local files or folders `names` that changed since the last push or pull."""
    if self._mirror is not None:
      self._mirror.push(*names)

  def push_soon(self, *names: str) -> None:
    """`push(names)` from a background thread, so the step loop does not wait for the bucket (metrics at
    log steps); `flush()` waits for it. Names pushed while an upload runs go in the next one."""
    if self._mirror is None:
      return
    with self._wake:
      if self._uploader is None:
        self._uploader = threading.Thread(target=self._upload_pending, daemon=True, name="workdir-upload")
        self._uploader.start()
      self._pending.update(names)
      self._wake.notify()

  def _upload_pending(self) -> None:
    while True:
      with self._wake:
        while not self._pending:
          self._busy = False
          self._wake.notify_all()
          self._wake.wait()
        names, self._pending, self._busy = sorted(self._pending), set(), True
      try:
        self._mirror.push(*names)
        self._error = None
      except storage.StorageError as e:  # a network blip: the next push uploads these files again
        self._error = e
        log.info(f"warning: uploading {', '.join(names)} to {self.path} failed ({e}); retrying at the next one")

  def flush(self, raise_error: bool = True, timeout_s: float | None = None) -> None:
    """Waits for the background uploads (`push_soon`), at most `timeout_s` seconds (a bucket that stopped
    answering; then a StorageError, and later calls do not wait again); raises the StorageError of the last
    one, if it failed and `raise_error` (not while another exception unwinds the loop)."""
    if self._uploader is None:
      return
    with self._wake:
      if not self._wake.wait_for(lambda: self._stuck or not (self._pending or self._busy), timeout_s):
        self._stuck = True
        self._error = storage.StorageError(f"uploading to {self.path} did not finish within {timeout_s:g}s "
                                           "(config.checkpoint_timeout_s): the bucket does not answer")
    if self._error is not None and raise_error:
      raise self._error
