"""A run's workdir, local or in a bucket (`--workdir=gs://bucket/run`, as TPU pod runs keep it).

Every file of the run is written to `local` first. For a local workdir that is the workdir itself and
`push`/`pull` do nothing. For a bucket workdir `local` is a copy in `$ELMO_JAX_CACHE/bucket/` that process 0
writes (`storage.Mirror`): `push(names)` uploads the files that changed, each as one object, after every
write of the loop (metrics and TensorBoard at log and eval steps, the export and config at saves); `pull()`
makes the copy the bucket's at the start, so a resumed run rewinds the bucket's `metrics.jsonl`, not a
local file a killed run wrote after its last upload. Checkpoints are not copied: Orbax writes
`checkpoints/` in the bucket itself, and the lock is an object there (`training/lock.py`).
"""
from __future__ import annotations

import os

from elmo_jax import storage

CHECKPOINTS = "checkpoints"
LOCK_FILE = "train.lock"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
PREPARED_DIR = "prepared"


class Workdir:
  """`path` as the user gave it (absolute when local), `local` (where files are written), `checkpoints`."""

  def __init__(self, path: str | os.PathLike):
    text = os.fspath(path)
    self.remote = storage.is_remote(text)
    self.path = text.rstrip("/") if self.remote else os.path.abspath(text)
    self.local = storage.copy_path(self.path, "workdirs") if self.remote else self.path
    self.checkpoints = storage.join(self.path, CHECKPOINTS)
    self._mirror = storage.Mirror(self.path, self.local, skip=(CHECKPOINTS, LOCK_FILE)) if self.remote else None

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
