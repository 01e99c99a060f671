"""A resumable embedding job shared by any number of processes: `OUTPUT.partial/` beside the output.

    OUTPUT.partial/settings.json          what the job is (input sha256, model fingerprint, flags)
    OUTPUT.partial/parts/CCCCCC-GGGG.hdf5 the datasets of part GGGG of chunk CCCCCC
    OUTPUT.partial/parts/CCCCCC-GGGG.json its commit record (sentences, tokens), written last
    OUTPUT.partial/parts/CCCCCC-GGGG.npz  stateful jobs: the LSTM state after the part

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
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import time
from typing import Any, Callable, TextIO

import h5py
import numpy as np

from elmo_jax.runtime import files
from elmo_jax.runtime import progress as progress_lib

SUFFIX = ".partial"
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
  """The folder of one embedding job; `open` creates it or checks that it is this job's."""

  def __init__(self, output_file: str, layout: Layout | None = None):
    self.folder = output_file + SUFFIX
    self.parts_dir = os.path.join(self.folder, "parts")
    self.layout = layout
    self._counted: dict[str, tuple[int, int]] = {}

  @staticmethod
  def check_folder(output_file: str) -> None:
    """Refuses, in one line, a job folder path `OUTPUT.partial` (or its `parts`) that is not a folder (e.g.
    a file left by hand or another tool); before any work. Raises JobError."""
    folder = os.fspath(output_file) + SUFFIX
    for path in (folder, os.path.join(folder, "parts")):
      if os.path.lexists(path) and not os.path.isdir(path):
        raise JobError(f"{path} is a file, not an embedding job folder; delete it")

  @classmethod
  def open(cls, output_file: str, settings: dict[str, Any], layout: Layout) -> "Job":
    cls.check_folder(output_file)
    job = cls(output_file, layout)
    path = os.path.join(job.folder, "settings.json")
    if not os.path.exists(path):  # every process writes the same content; a rename is atomic
      os.makedirs(job.parts_dir, exist_ok=True)
      files.write_json(path, settings)
    try:
      with open(path, encoding="utf-8") as f:
        saved = json.load(f)
    except (OSError, ValueError) as e:
      raise JobError(f"{job.folder}: unreadable settings.json ({e}); delete the folder to start over") from None
    if saved != settings:
      diff = files.first_difference(saved, settings)
      raise JobError(f"{job.folder}: an unfinished job of another run ({diff}); rerun with the same input "
                     f"and flags to finish it, or delete {job.folder} to start over")
    os.makedirs(job.parts_dir, exist_ok=True)
    return job

  def path(self, part: tuple[int, int], ext: str) -> str:
    return os.path.join(self.parts_dir, f"{part_name(part)}.{ext}")

  def committed(self) -> dict[str, tuple[int, int]]:
    """{part name: (sentences, tokens)} of every committed part (any process's): one directory listing,
    and each record read once."""
    for record in glob.glob(os.path.join(self.parts_dir, "*.json")):
      name = os.path.basename(record)[:-5]
      if name not in self._counted:
        try:
          with open(record, encoding="utf-8") as f:
            meta = json.load(f)
          self._counted[name] = (int(meta["sentences"]), int(meta["tokens"]))
        except (OSError, ValueError, KeyError):
          continue  # being written by another process (it is renamed into place, so: a stale read)
    return self._counted

  def done_parts(self, parts: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of `parts` that are committed (one listing of the folder)."""
    committed = self.committed()
    return {p for p in parts if part_name(p) in committed and os.path.exists(self.path(p, "hdf5"))}

  def commit(self, part: tuple[int, int], tmp_hdf5: str, sentences: int, tokens: int, state=None) -> None:
    """Makes a written part final: the data file, the state (stateful jobs), then the record."""
    os.replace(tmp_hdf5, self.path(part, "hdf5"))
    if state is not None:
      with files.atomic_path(self.path(part, "npz"), suffix=".npz") as tmp:
        np.savez(tmp, c=state[0], h=state[1])
    files.write_json(self.path(part, "json"), {"sentences": sentences, "tokens": tokens})

  def state_after(self, part: tuple[int, int]):
    with np.load(self.path(part, "npz")) as z:
      return z["c"], z["h"]

  def done_counts(self) -> tuple[int, int]:
    committed = self.committed().values()
    return sum(s for s, _ in committed), sum(t for _, t in committed)

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
    files.write_text(os.path.join(self.folder, f"failed-{process}.txt"), f"{type(error).__name__}: {error}\n")

  def clear_failure(self, process: int) -> None:
    path = os.path.join(self.folder, f"failed-{process}.txt")
    if os.path.exists(path):
      os.remove(path)

  def merge(self, dest: h5py.File) -> int:
    """Copies every part's datasets, part by part in order, into `dest` (HDF5's own object copy: layout and
    dtype kept; names holding '/' get their groups); returns the number of datasets."""
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
