"""The room an embedding job (`embedding/job.Job`) needs on disk, and a write that found none.

A full disk, a used-up quota or a file-size limit (ulimit -f; the command ignores SIGXFSZ, so such a write
fails with EFBIG instead of killing it) becomes one line naming the folder and the space the job needs
there, estimated from its sizes: the committed parts' bytes per byte of their text, times the text still to
embed, then the merged file (the parts stay until it is written). The committed parts stay for the rerun.
Parts are built in memory and written whole (a plain OSError when the disk is full); the merge, which HDF5
writes in place and cannot recover from a failed write, starts only if its file fits (`check_room`).
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import shutil
from typing import Iterator

from elmo_jax.embedding.job import Job, JobError
from elmo_jax.runtime.files import human_bytes

_WHY = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
        errno.EFBIG: "a file reached this process's file-size limit (ulimit -f)"}


class NoSpaceError(JobError):
  """The disk (or a file-size limit) stopped the job; the message names the folder and the space needed."""


def no_space(error: BaseException) -> int | None:
  """The errno (ENOSPC, EDQUOT, EFBIG) of a write the disk or a file-size limit stopped, else None; also
  for h5py's errors, which give it only in the message ('errno = 28')."""
  if not isinstance(error, OSError):
    return None
  if error.errno in _WHY:
    return error.errno
  found = re.search(r"errno = (\d+)", str(error))
  return int(found.group(1)) if found and int(found.group(1)) in _WHY else None


def estimate(job: Job) -> tuple[int, int]:
  """(bytes of `job`'s parts still to write, bytes of all its parts): the committed parts' bytes per byte of
  their text (or those of the part this run tried to commit) times the text still to embed."""
  records = list(job.committed().values())
  done_bytes = sum(int(r.get("bytes", 0)) for r in records)
  done_text = sum(int(r.get("input_bytes", 0)) for r in records)
  size, text = (done_bytes, done_text) if done_text else job.attempted
  left = max(job.input_bytes - done_text, 0) * size / max(text, 1)
  return int(left), int(done_bytes + left)


@contextlib.contextmanager
def named(job: Job, merging: bool = False) -> Iterator[None]:
  """Turns a write the disk or a file-size limit stopped (`no_space`) into `NoSpaceError`'s one line
  (`message`); other errors pass."""
  try:
    yield
  except OSError as e:
    if no_space(e) is None:
      raise
    raise NoSpaceError(message(job, e, merging=merging)) from None


def check_room(job: Job, extra: int = 0) -> None:
  """Process 0, before the merge: raises `NoSpaceError` (one line) when the merged file (about the parts'
  bytes and `extra`, e.g. sentence_to_index) would not fit in the output's folder or under the file-size
  limit, so the merge never starts then."""
  output = estimate(job)[1] + extra
  limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
  if limit != resource.RLIM_INFINITY and output > limit:
    raise NoSpaceError(message(job, OSError(errno.EFBIG, "File too large"), True, extra))
  if shutil.disk_usage(_folder(job)).free < output:
    raise NoSpaceError(message(job, OSError(errno.ENOSPC, "No space left on device"), True, extra))


def message(job: Job, error: OSError, merging: bool = False, extra: int = 0) -> str:
  """One line for a write of `job` that `no_space` stopped: the folder, why, the space the job needs there."""
  left, output = estimate(job)
  output += extra
  code = no_space(error)
  if code == errno.EFBIG:
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    need = (f"the merged file will be about {human_bytes(output)}, the limit is "
            f"{'unlimited' if limit == resource.RLIM_INFINITY else human_bytes(limit)}")
  else:
    need = (f"the job needs about {human_bytes(output if merging else left + output)} free there "
            + ("for the merged file" if merging else
               f"({human_bytes(left)} of parts still to write, then {human_bytes(output)} for the merged file)")
            + f", {human_bytes(shutil.disk_usage(_folder(job)).free)} are free")
  return (f"{_folder(job)}: {_WHY[code]} while {'merging the parts' if merging else 'writing the parts'}; "
          f"{need}; the finished parts are kept in {job.folder}: make room and rerun the same command to resume")


def _folder(job: Job) -> str:
  """Where the job writes: its parts beside the output, and the output."""
  return os.path.dirname(os.path.abspath(job.output_file))
