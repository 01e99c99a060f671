"""A resumable embedding job shared by any number of processes: `OUTPUT.partial/` beside the output.

    OUTPUT.partial/settings.json          what the job is (input sha256, model fingerprint, flags)
    OUTPUT.partial/parts/CCCCCC-GGGG.hdf5 the datasets of part GGGG of chunk CCCCCC
    OUTPUT.partial/parts/CCCCCC-GGGG.json its commit record, written last: sentences, tokens, the part's name,
                                          size and sha256 (and its state's), the names of its datasets
    OUTPUT.partial/parts/CCCCCC-GGGG.npz  stateful jobs: the LSTM state after the part
    OUTPUT.partial/process-P.lock         held by process P of the running command (`runtime/lock.FileLock`)
    OUTPUT.bad-parts/                     parts whose files differ from their records, set aside (not deleted)

The input is cut into chunks of `chunk_size` lines (the unit of length sorting, as before) and each chunk
into parts of `part_batches` batches (the unit of resumption). The layout depends only on the input and
the flags, not on the number of processes or on where a run stopped: process p of n embeds a contiguous
range of chunks, a rerun skips every committed part, and process 0 merges all parts, in order, into the
one output file (`merge`) and removes the folder. So a resumed or many-process job writes the file an
uninterrupted single-process job writes.

Why a merge and not a file of external links or a virtual dataset over the parts: the result is one
self-contained HDF5 file in the `allennlp elmo` layout that every reader (AllenNLP, h5py, HDF5 tools in
any language) opens and that can be moved or copied alone; links break when the parts move, and virtual
datasets cannot map one variable-shape dataset per sentence. Parts are committed with a rename and a
record written after it, so a `kill -9` loses at most the part being written, never a finished one.

A part is trusted only as its record describes it: a rerun checks the size and sha256 of each part it would
skip (process 0 checks the other processes' parts before the merge), and one that differs (changed, truncated,
copied from another part) is named, moved to `OUTPUT.bad-parts/` and embedded again; names that clash across
parts (the same dataset twice, or `x` beside `x/y`, which HDF5 makes a group) stop the job before the merge.
A disk that fills up (or a file-size limit) is one line naming the folder and the space the job needs
(`embedding/space.py`); the committed parts stay for the rerun.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import time
from typing import Any, Callable, TextIO

import h5py
import numpy as np

from elmo_jax.runtime import files
from elmo_jax.runtime import lock as file_lock
from elmo_jax.runtime import progress as progress_lib

SUFFIX = ".partial"
BAD_PARTS = ".bad-parts"  # OUTPUT.bad-parts/: parts set aside
# Batches per part: what a kill -9 can cost, one file each, and how long the token table lives (it starts
# fresh at every part, see `Embedder.batches`): 512 sentences at one device's default batch.
DEFAULT_PART_BATCHES = 8


class JobError(ValueError):
  """A job folder that does not belong to this run; the message names the folder and what differs."""


@dataclasses.dataclass(frozen=True)
class Layout:
  """Which lines make up chunk k and its parts; the same for every process and every rerun."""
  lines: int
  chunk_size: int  # lines per chunk (a multiple of batch_size)
  batch_size: int
  part_batches: int

  @property
  def chunks(self) -> int:
    return -(-self.lines // self.chunk_size)

  def chunk_lines(self, chunk: int) -> range:
    return range(chunk * self.chunk_size, min(self.lines, (chunk + 1) * self.chunk_size))

  def parts(self, chunk: int) -> int:
    batches = -(-len(self.chunk_lines(chunk)) // self.batch_size)
    return -(-batches // self.part_batches)

  def all_parts(self) -> list[tuple[int, int]]:
    return [(c, g) for c in range(self.chunks) for g in range(self.parts(c))]

  def share(self, process: int, processes: int) -> range:
    """The contiguous chunks process `process` of `processes` embeds."""
    return range(process * self.chunks // processes, (process + 1) * self.chunks // processes)


def part_name(part: tuple[int, int]) -> str:
  return f"{part[0]:06d}-{part[1]:04d}"


class Job:
  """The folder of one embedding job; `open` creates it or checks that it is this job's, and locks it."""

  def __init__(self, output_file: str, layout: Layout | None = None):
    self.output_file = output_file
    self.folder = output_file + SUFFIX
    self.parts_dir = os.path.join(self.folder, "parts")
    self.bad_dir = output_file + BAD_PARTS
    self.layout = layout
    self._records: dict[str, dict[str, Any]] = {}
    self._verified: set[str] = set()  # parts checked against their records (or written) by this run
    self._lock: file_lock.FileLock | None = None
    self.input_bytes = 0  # of the whole input text (`space.estimate`)
    self.attempted = (0, 0)  # (bytes, bytes of its text) of the last part this run tried to commit

  @staticmethod
  def check_folder(output_file: str) -> None:
    """Refuses, in one line, a job folder path `OUTPUT.partial` (or its `parts`) that is not a folder (e.g.
    a file left by hand or another tool); before any work. Raises JobError."""
    folder = os.fspath(output_file) + SUFFIX
    for path in (folder, os.path.join(folder, "parts")):
      if os.path.lexists(path) and not os.path.isdir(path):
        raise JobError(f"{path} is a file, not an embedding job folder; delete it")

  @classmethod
  def open(cls, output_file: str, settings: dict[str, Any], layout: Layout, process_index: int = 0) -> "Job":
    """The job of `settings`, locked for process `process_index` of this command (`release` it).

    Raises:
      JobError: the folder is another job's, or another live command holds it (the folder is left as it was).
    """
    job = cls(output_file, layout)  # (`check_folder` was made once, before the model loaded: `check_job`)
    existed = os.path.isdir(job.folder)
    os.makedirs(job.folder, exist_ok=True)
    try:
      job._lock = file_lock.FileLock.acquire(os.path.join(job.folder, f"process-{process_index}.lock"))
    except file_lock.Held as e:
      which = f" (its process {process_index})" if process_index else ""
      raise JobError(f"{job.folder} is in use by another embed command{which}: {e.holder}; wait for it to finish "
                     "or stop it, or give another --output_file") from None
    try:
      job._check_settings(settings)
    except BaseException:
      job.release()
      for folder in ([] if existed else [job.parts_dir, job.folder]):  # made here, and still empty
        try:
          os.rmdir(folder)
        except OSError:
          pass
      raise
    return job

  def _check_settings(self, settings: dict[str, Any]) -> None:
    path = os.path.join(self.folder, "settings.json")
    if not os.path.exists(path):  # every process writes the same content; a rename is atomic
      os.makedirs(self.parts_dir, exist_ok=True)
      files.write_json(path, settings)
    try:
      with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    except (OSError, ValueError) as e:
      raise JobError(f"{self.folder}: unreadable settings.json ({e}); delete the folder to start over") from None
    if saved != settings:
      diff = files.first_difference(saved, settings)
      raise JobError(f"{self.folder}: an unfinished job of another run ({diff}); rerun with the same input "
                     f"and flags to finish it, or delete {self.folder} to start over")
    os.makedirs(self.parts_dir, exist_ok=True)

  def release(self) -> None:
    """Lets another command take the job (idempotent)."""
    if self._lock is not None:
      self._lock.release()
      self._lock = None

  def path(self, part: tuple[int, int], ext: str) -> str:
    return os.path.join(self.parts_dir, f"{part_name(part)}.{ext}")

  def committed(self) -> dict[str, dict[str, Any]]:
    """{part name: its record} of every committed part (any process's): one directory listing, and each
    record read once."""
    for record in glob.glob(os.path.join(self.parts_dir, "*.json")):
      name = os.path.basename(record)[:-5]
      if name not in self._records:
        try:
          with open(record, encoding="utf-8") as f:
            meta = json.load(f)
          if isinstance(meta, dict) and isinstance(meta.get("sentences"), int) and isinstance(meta.get("tokens"), int):
            self._records[name] = meta
        except (OSError, ValueError):
          continue  # being written by another process (it is renamed into place, so: a stale read)
    return self._records

  def done_parts(self, parts: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of `parts` that are committed (one listing of the folder)."""
    committed = self.committed()
    return {p for p in parts if part_name(p) in committed and os.path.exists(self.path(p, "hdf5"))}

  def verified_parts(self, parts: list[tuple[int, int]], warn: Callable[[str], Any]) -> set[tuple[int, int]]:
    """Those of `parts` that are committed and whose files are the ones their records describe; any other
    committed part is set aside (`set_aside`, `warn`ed about in one line naming it), to be embedded again."""
    done = set()
    for part in sorted(self.done_parts(parts)):
      problem = self.problem(part)
      if problem is None:
        done.add(part)
      else:
        warn(f"{self.path(part, 'hdf5')}: {problem}; set aside in {self.set_aside(part)}, embedding it again")
    return done

  def problem(self, part: tuple[int, int]) -> str | None:
    """Why committed `part` cannot be merged (its files are not the ones its record describes), or None;
    checked once per run."""
    name = part_name(part)
    if name in self._verified:
      return None
    meta, path = self._records[name], self.path(part, "hdf5")
    if "sha256" not in meta or "part" not in meta:
      return "its record has no checksum (written by an older version)"
    if meta["part"] != name:
      return f"its record is part {meta['part']}'s (copied from another part?)"
    size = os.path.getsize(path)
    if size != meta["bytes"]:
      return f"{size} bytes where its record says {meta['bytes']} (truncated or changed since it was written)"
    if files.sha256_file(path) != meta["sha256"]:
      return "its sha256 differs from its record (changed since it was written)"
    state = self.path(part, "npz")
    if meta.get("state_sha256") and (not os.path.exists(state) or files.sha256_file(state) != meta["state_sha256"]):
      return f"its state {os.path.basename(state)} is missing or differs from its record"
    self._verified.add(name)
    return None

  def set_aside(self, part: tuple[int, int]) -> str:
    """Moves `part`'s files (data, state, record) into OUTPUT.bad-parts/ (a name taken there gets a number);
    returns that folder. The part is then not committed."""
    name = part_name(part)
    os.makedirs(self.bad_dir, exist_ok=True)
    n = 0
    while any(os.path.exists(os.path.join(self.bad_dir, f"{name}{f'.{n}' if n else ''}.{ext}"))
              for ext in ("hdf5", "json", "npz")):
      n += 1
    for ext in ("json", "hdf5", "npz"):  # the record first: the part is no longer committed
      if os.path.exists(self.path(part, ext)):
        os.replace(self.path(part, ext), os.path.join(self.bad_dir, f"{name}{f'.{n}' if n else ''}.{ext}"))
    self._records.pop(name, None)
    return self.bad_dir

  def commit(self, part: tuple[int, int], tmp_hdf5: str, image: bytes, counts: tuple[int, int, int],
             keys: list[str], state=None) -> None:
    """Makes a part final: its data (`image`, the HDF5 file's bytes) written to `tmp_hdf5` and renamed into
    place, the state (stateful jobs), then the record: `counts` (sentences, tokens, bytes of their text), the
    part's name, the data's size and sha256 (and the state's), the names of its datasets (`keys`)."""
    self.attempted = (len(image), counts[2])
    with open(tmp_hdf5, "wb") as f:
      f.write(image)
    record = {"part": part_name(part), "sentences": counts[0], "tokens": counts[1], "input_bytes": counts[2],
              "bytes": len(image), "sha256": hashlib.sha256(image).hexdigest(), "keys": keys}
    if state is not None:
      with files.atomic_path(self.path(part, "npz"), suffix=".npz") as tmp:
        np.savez(tmp, c=state[0], h=state[1])
      record["state_sha256"] = files.sha256_file(self.path(part, "npz"))
    os.replace(tmp_hdf5, self.path(part, "hdf5"))
    files.write_json(self.path(part, "json"), record, indent=None)
    self._records[record["part"]] = record
    self._verified.add(record["part"])

  def state_after(self, part: tuple[int, int]):
    with np.load(self.path(part, "npz")) as z:
      return z["c"], z["h"]

  def done_counts(self) -> tuple[int, int]:
    committed = self.committed().values()
    return sum(int(r["sentences"]) for r in committed), sum(int(r["tokens"]) for r in committed)

  def wait_for_all(self, every: float = 2.0, on_poll: Callable[[], Any] | None = None) -> None:
    """Process 0: waits until every part of the job is committed (by whichever process); a failure another
    process recorded stops the wait with its message."""
    parts = self.layout.all_parts()
    while set(parts) - self.done_parts(parts):
      for failure in sorted(glob.glob(os.path.join(self.folder, "failed-*.txt"))):
        with open(failure, encoding="utf-8") as f:
          raise JobError(f"{os.path.basename(failure)[:-4].replace('-', ' process ')}: {f.read().strip()}; "
                         "the finished parts are kept: rerun every process to resume")
      if on_poll is not None:
        on_poll()
      time.sleep(every)

  def record_failure(self, process: int, error: BaseException) -> None:
    """A process other than 0 failed: tells process 0 (waiting in `wait_for_all`) instead of leaving it
    waiting for parts that will not come."""
    try:
      files.write_text(os.path.join(self.folder, f"failed-{process}.txt"), f"{type(error).__name__}: {error}\n")
    except OSError:  # e.g. the disk is full: this process's own error is the one to report
      pass

  def clear_failure(self, process: int) -> None:
    path = os.path.join(self.folder, f"failed-{process}.txt")
    if os.path.exists(path):
      os.remove(path)

  def check_parts(self) -> None:
    """Process 0, before the merge: every part is the one its record describes (a bad one is set aside and
    named: the rerun embeds it again), and no two parts' dataset names clash."""
    for part in self.layout.all_parts():
      problem = self.problem(part)
      if problem is not None:
        raise JobError(f"{self.path(part, 'hdf5')}: {problem}; set aside in {self.set_aside(part)}: rerun the "
                       "same command (every process) to embed it again")
    owner: dict[tuple[str, ...], tuple[str, str]] = {}  # a dataset's path ('/' nests; '//' is '/') -> part, name
    for part in self.layout.all_parts():
      name = part_name(part)
      for key in self._records[name]["keys"]:
        path = tuple(c for c in key.split("/") if c)
        if path in owner:
          raise JobError(f"{self.folder}: parts {owner[path][0]} and {name} both hold dataset {key!r}; the merge "
                         f"cannot write both: move the wrong part's files out of {self.parts_dir} and rerun")
        owner[path] = (name, key)
    for path, (name, key) in owner.items():
      group = next((path[:k] for k in range(1, len(path)) if path[:k] in owner), None)
      if group is not None:
        raise JobError(f"{self.folder}: part {owner[group][0]}'s dataset {owner[group][1]!r} and part {name}'s "
                       f"{key!r} clash ('/' makes the first a group): the merge cannot write both; rerun without "
                       "--use_sentence_keys")

  def merge(self, dest: h5py.File) -> int:
    """Copies every part's datasets, part by part in order, into `dest` (HDF5's own object copy: layout and
    dtype kept; names holding '/' get their groups); returns the number of datasets. `check_parts` first."""
    n = 0
    for part in self.layout.all_parts():
      with h5py.File(self.path(part, "hdf5"), "r") as src:
        names: list[str] = []
        src.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        for name in names:
          src.copy(src[name], dest, name=name)
        n += len(names)
    return n

  def remove(self) -> None:
    shutil.rmtree(self.folder, ignore_errors=True)


class Progress(progress_lib.Lines):
  """Prints `embedded n/N sentences (x sent/s, y tok/s, ETA h:mm:ss)` at most every `every` seconds: the
  project's line progress (`progress.Lines`; not a bar, so a job's log shows it and process 0 can count
  every process's committed parts).

  `done`: what earlier runs of a resumed job finished; `poll`: () -> (sentences, tokens) done by all
  processes (process 0 of many reads the job's committed parts), else this process's count is used.
  Rates are this run's.
  """

  def __init__(self, total: int, every: float | None = 5.0, stream: TextIO | None = None,
               done: tuple[int, int] = (0, 0), poll: Callable[[], tuple[int, int]] | None = None):
    super().__init__(total, self._describe, every, stream, done, poll)

  @property
  def sentences(self) -> int:
    """This process's, this run's."""
    return self.counts[0]

  @property
  def tokens(self) -> int:
    return self.counts[1]

  def _describe(self, counts, rates, eta: str) -> str:
    return (f"embedded {counts[0]}/{self.total} sentences ({rates[0]:.1f} sent/s, {rates[1]:.0f} tok/s, "
            f"ETA {eta})")
