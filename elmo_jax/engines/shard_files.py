"""An engine job's output folder: one shard file per shard, written whole by the worker that embedded it, its
record beside it, the job's settings, and at the end the manifest.

    OUTPUT_DIR/job.json               the settings (model, output, chunking, inputs with their sha256): a rerun
                                      with other settings is refused, one with the same ones resumes
    OUTPUT_DIR/shard-00012.parquet    shard 12's lines: index, file, line, text, embedding   (--output_format=parquet)
    OUTPUT_DIR/shard-00012.hdf5       the same lines in AllenNLP's `elmo` layout: dataset str(index) per line,
                                      sentence_to_index of its lines                     (--output_format=hdf5)
    OUTPUT_DIR/shard-00012.json       its record: the lines it holds (corpus indices first_index ..
                                      first_index + lines - 1, less its bad lines), sha256 and size (in a
                                      bucket also its crc32c, which the bucket keeps too), tokens, bad
                                      lines; written after the shard, so a record means a whole shard
    OUTPUT_DIR/manifest.json          every shard's record, in corpus order, and every bad line: which shard
                                      holds a line index, and the checksums a reader can verify

Each file is written to a temp name and renamed (a bucket object is uploaded whole), so no reader and no rerun
ever sees half a shard; a rerun skips each shard whose record and file still agree (`written`).
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import tempfile
from typing import Any, Sequence

import h5py
import numpy as np

from elmo_jax.engines.corpus import Shard
from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded
from elmo_jax.runtime import storage

FORMATS = ("parquet", "hdf5")
JOB_FILE, MANIFEST = "job.json", "manifest.json"
ROW_GROUP_LINES = 512  # lines a Parquet row group holds: what a shard keeps in memory before writing it


class JobFolderError(ValueError):
  """An output folder that holds another job, or a shard file that does not match its record; one line."""


def shard_name(number: int, output_format: str) -> str:
  return f"shard-{number:05d}.{output_format}"


def record_name(number: int) -> str:
  return f"shard-{number:05d}.json"


def open_job(output_dir: str, settings: dict[str, Any]) -> None:
  """The job's folder for `settings`: created with its `job.json`, or an earlier run's with the same settings
  (resumed); JobFolderError naming the first difference otherwise, or a folder that cannot be written
  (`check_folder`)."""
  check_folder(output_dir)
  path = storage.join(output_dir, JOB_FILE)
  if storage.exists(path):
    saved = _read_json(path)
    if saved != settings:
      raise JobFolderError(f"{output_dir} holds a job of other settings ({files.first_difference(saved, settings)}"
                           "); give another --output_dir, or remove it to start again")
    return
  if storage.isdir(output_dir) and storage.listdir(output_dir):
    raise JobFolderError(f"{output_dir} is not empty and holds no {JOB_FILE}; give a new or empty --output_dir")
  storage.makedirs(output_dir)
  storage.write_json(path, settings)


def check_folder(output_dir: str, inputs: Sequence[str] = ()) -> None:
  """JobFolderError (one line) for an output folder that cannot be written: a file, a run's checkpoints, one that
  holds an input, a bucket that does not exist or refuses writes (`storage.check_output`: a probe object written
  and removed)."""
  try:
    storage.check_output(output_dir, "--output_dir", inputs=inputs, directory=True)
  except files.UnsafeOutputError as e:
    raise JobFolderError(str(e)) from None


def written(output_dir: str, shards: Sequence[Shard], settings_sha: str, output_format: str,
            threads: int = 8) -> dict[int, dict[str, Any]]:
  """{shard number: its record} of the shards an earlier run wrote and that still check: a record of these
  settings, a file of its size and checksum: a local file's sha256 (read once each, on `threads` threads), a
  bucket object's crc32c as the bucket keeps it (one listing of the folder: nothing downloaded but records)."""
  objects = storage.list_objects(output_dir) if storage.is_remote(output_dir) else None

  def check(shard: Shard) -> dict[str, Any] | None:
    name, data = record_name(shard.number), shard_name(shard.number, output_format)
    path = storage.join(output_dir, name)
    if (name not in objects) if objects is not None else not os.path.exists(path):
      return None
    try:
      record = _read_json(path)
    except JobFolderError:
      return None  # a damaged record: its shard is written again
    if record.get("settings") != settings_sha or record.get("written") is not True:
      return None
    if objects is not None:
      info = objects.get(data)
      same = (info is not None and int(info["size"]) == record.get("bytes")
              and info.get("crc32c") is not None and info.get("crc32c") == record.get("crc32c"))
    else:
      path = os.path.join(output_dir, data)
      same = os.path.isfile(path) and files.sha256_file(path) == record.get("sha256")
    return record if same else None
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    found = list(pool.map(check, shards))
  return {s.number: r for s, r in zip(shards, found) if r is not None}


def _read_json(path: str) -> Any:
  try:
    return json_bounded.loads(storage.read_bytes(path), where=path)
  except (ValueError, OSError) as e:
    raise JobFolderError(f"{path}: not a readable record ({e})") from None


class ShardWriter:
  """Writes one shard's lines (in corpus order) into a temp file and, at `close`, under its name in the output
  folder; `abort` removes the temp file. Memory holds at most `ROW_GROUP_LINES` lines of Parquet."""

  def __init__(self, output_dir: str, shard: Shard, output_format: str, dtype: str):
    if output_format not in FORMATS:
      raise ValueError(f"output_format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    self.output_dir, self.shard, self.format, self.dtype = output_dir, shard, output_format, dtype
    self.name = shard_name(shard.number, output_format)
    local_dir = tempfile.gettempdir() if storage.is_remote(output_dir) else output_dir
    fd, self.tmp = tempfile.mkstemp(dir=local_dir, prefix=f".{self.name}.{socket.gethostname()}.{os.getpid()}.",
                                    suffix=".tmp")
    os.close(fd)
    self.lines = 0
    self.crc32c: str | None = None  # a bucket object's, once closed (`written` checks it)
    self._rows: list[tuple[int, int, str, np.ndarray]] = []
    self._index: dict[str, str] = {}
    self._out: Any = None

  def put(self, index: int, line: int, text: str, embedding: np.ndarray) -> None:
    """One line: its corpus index, line in its file, text and output array."""
    self.lines += 1
    if self.format == "hdf5":
      if self._out is None:
        self._out = h5py.File(self.tmp, "w")
      self._out.create_dataset(str(index), data=embedding, dtype=self.dtype)
      self._index[text] = str(index)  # later duplicates win, as in AllenNLP
      return
    self._rows.append((index, line, text, embedding))
    if len(self._rows) >= ROW_GROUP_LINES:
      self._flush()

  def _flush(self) -> None:
    import pyarrow as pa  # pylint: disable=g-import-not-at-top  (the ray extra's; HDF5 shards need none)
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    table = pa.table({
        "index": pa.array([r[0] for r in self._rows], pa.int64()),
        "file": pa.array([self.shard.path] * len(self._rows), pa.string()).dictionary_encode(),
        "line": pa.array([r[1] for r in self._rows], pa.int64()),
        "text": pa.array([r[2] for r in self._rows], pa.string()),
        "embedding": nested_array([r[3] for r in self._rows], self.dtype)})
    if self._out is None:
      self._out = pq.ParquetWriter(self.tmp, table.schema)
    self._out.write_table(table)
    self._rows = []

  def close(self) -> tuple[str, int]:
    """Finishes the file and moves it under its name (atomically); returns its (sha256, size)."""
    if self.format == "parquet" and (self._rows or self._out is None):
      self._flush()  # an empty shard (every line bad) is still a file with the schema
    if self.format == "hdf5":
      if self._out is None:
        self._out = h5py.File(self.tmp, "w")
      self._out.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))[0] = \
          json.dumps(self._index)
    self._out.close()
    self._out = None
    digest, size = files.sha256_file(self.tmp), os.path.getsize(self.tmp)
    target = storage.join(self.output_dir, self.name)
    if storage.is_remote(target):
      self.crc32c = storage.crc32c_file(self.tmp)  # what the bucket keeps: a rerun checks it, downloading nothing
      storage.upload(self.tmp, target)  # an object appears whole
      os.remove(self.tmp)
    else:
      os.chmod(self.tmp, 0o666 & ~files.current_umask())
      os.replace(self.tmp, target)
    return digest, size

  def abort(self) -> None:
    if self._out is not None:
      try:
        self._out.close()
      except Exception:  # pylint: disable=broad-except  (the error being handled is the one to report)
        pass
    if os.path.exists(self.tmp):
      os.remove(self.tmp)


def nested_array(arrays: Sequence[np.ndarray], dtype: str):
  """Per-line arrays of one rank (e.g. `[n_layers + 1, n_tokens, 2P]`, n_tokens varying) as one Arrow column
  of nested lists: a dimension every line shares is a fixed-size list, one that varies a list; the values in
  `dtype`, without a copy per element."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  (the ray extra's)
  value_type = pa.float16() if dtype == "float16" else pa.float32()
  flat = np.concatenate([np.asarray(a, dtype).reshape(-1) for a in arrays]) if arrays else np.zeros(0, dtype)
  out = pa.array(flat, value_type)
  ndim = arrays[0].ndim if arrays else 1
  for level in reversed(range(ndim)):
    # the lists at this level: each line has prod(shape[:level]) of them, each shape[level] long
    lengths = np.concatenate([np.full(int(np.prod(a.shape[:level])), a.shape[level], np.int64) for a in arrays]) \
        if arrays else np.zeros(0, np.int64)
    if arrays and np.all(lengths == lengths[0]) and lengths[0] > 0:
      out = pa.FixedSizeListArray.from_arrays(out, int(lengths[0]))
    else:
      offsets = np.concatenate([[0], np.cumsum(lengths)])
      kind = pa.LargeListArray if offsets[-1] >= 2**31 else pa.ListArray
      out = kind.from_arrays(pa.array(offsets, pa.int64() if kind is pa.LargeListArray else pa.int32()), out)
  return out


def write_record(output_dir: str, record: dict[str, Any]) -> None:
  """A shard's record, after its file: the commit of the shard."""
  storage.write_json(storage.join(output_dir, record_name(record["shard"])), record)


def write_manifest(output_dir: str, settings: dict[str, Any], records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The manifest of a finished job (every shard's record, in order); returns it."""
  records = sorted(records, key=lambda r: r["shard"])
  bad = [b for r in records for b in r["bad_lines"]]
  manifest = {"settings": settings, "lines": sum(r["lines"] for r in records),
              "written_lines": sum(r["written_lines"] for r in records), "tokens": sum(r["tokens"] for r in records),
              "bytes": sum(r["bytes"] for r in records), "bad_lines": bad,
              "shards": [{k: r[k] for k in ("shard", "file", "input", "first_line", "first_index", "lines",
                                            "written_lines", "tokens", "bytes", "sha256")} for r in records]}
  storage.write_json(storage.join(output_dir, MANIFEST), manifest)
  return manifest
