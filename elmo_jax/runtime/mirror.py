"""A run's workdir in a bucket: `Mirror` keeps a local copy that process 0 writes; `push` uploads what changed
(each file one object, so a reader sees an old or a new file, never half of one), `pull` brings the bucket's
state back (the bucket wins: a file written after the last upload is rolled back, as a restore rolls back).
Orbax writes checkpoints to the bucket itself (`training/checkpoint.py`)."""
from __future__ import annotations

import os
import threading
from typing import Iterable

from elmo_jax.runtime import files
from elmo_jax.runtime import gcs
from elmo_jax.runtime import storage


class Mirror:
  """A local folder kept as a copy of a bucket folder that this process writes (a run's workdir).

  `pull()` makes the local folder the bucket's (top-level names in `skip`, e.g. checkpoints/, stay in the
  bucket only); `push(*names)` uploads those local files or folders, only the files changed since the last
  push or pull.
  """

  def __init__(self, url: str, folder: str, skip: Iterable[str] = ()):
    self.url, self.folder, self.skip = url.rstrip("/"), folder, tuple(skip)
    self._lock = threading.Lock()  # one push at a time (a background one and the loop's), one record

  def pull(self, *names: str) -> None:
    """The bucket's state of `names` (default: everything but `skip`) into the local folder."""
    wanted = lambda top: top not in self.skip and (not names or top in names)  # noqa: E731
    objects = storage.list_objects(self.url)
    storage.sync(self.folder, {rel: info for rel, info in objects.items() if wanted(rel.split("/")[0])},
                 delete=wanted)

  def push(self, *names: str) -> None:
    with self._lock:
      self._push(names)

  def _push(self, names: Iterable[str]) -> None:
    record = storage.read_record(self.folder)
    fs = gcs.filesystem()
    changed = False
    for name in names:
      for path in storage.local_files(os.path.join(self.folder, name)):
        rel = os.path.relpath(path, self.folder).replace(os.sep, "/")
        entry = record.get(rel)
        stamp = storage.file_stamp(path)
        if isinstance(entry, list) and len(entry) == 3 and stamp == entry[1:]:
          continue
        target = storage.join(self.url, rel)
        if rel.endswith(".jsonl"):  # appended to while this uploads: whole records only, the rest next time
          with open(path, "rb") as f:
            data = f.read()
          gcs.call(target, fs.pipe_file, gcs.key(target), data[:data.rfind(b"\n") + 1])
        else:
          gcs.call(target, fs.put_file, path, gcs.key(target))
        # The stamp from before the upload: a file written meanwhile differs from it and goes up next time.
        record[rel] = [str(gcs.call(target, fs.info, gcs.key(target)).get("generation")), *stamp]
        changed = True
    if changed:
      files.write_json(os.path.join(self.folder, storage.RECORD), record)
