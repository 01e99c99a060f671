"""Paths in a cloud bucket (`gs://bucket/...`): the one place that talks to a bucket.

Every command takes a bucket URL wherever it takes a path; a local path is never touched here. How each kind
of file gets there (the README's "Workdirs in a bucket" section has the costs):
- inputs (text files, a prepared corpus, vocab, options/weights, a run to start from): `local(url)` copies
  the object, or every object under the prefix, once into `$ELMO_JAX_CACHE/bucket/` and returns the local
  path. A copy is kept with each object's generation: a rerun (a resume) downloads only what changed in the
  bucket, and a download is checked against the object's crc32c before it replaces the old copy. What the
  copy must be (a prepared corpus's sha256s, a vocab) is checked by the reader, as for a local file.
- a run's workdir: `runtime/mirror.Mirror` keeps a local copy and uploads what changed.
- outputs (evaluate's folder, embed's HDF5, plan's HLO): `staged_output(url)` yields a local path and
  uploads it once the command succeeded, so nothing partial reaches the bucket.

The Google client libraries take their endpoint from the environment: `STORAGE_EMULATOR_HOST` (gcsfs and
google-cloud-storage) and `TENSORSTORE_GCS_HTTP_URL` (Orbax's tensorstore) point them at an emulator.
"""
from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import json
import os
import shutil
import time
from typing import Any, Callable, Iterable, Iterator

from elmo_jax.runtime import cache
from elmo_jax.runtime import files
from elmo_jax.runtime import gcs
from elmo_jax.runtime import outside_names
from elmo_jax.runtime.gcs import StorageError, check_url  # noqa: F401  (callers name them storage.X)
from elmo_jax.runtime.run_layout import CONFIG_FILE, RUN_FOLDERS

SCHEME = gcs.SCHEME
RECORD = ".bucket-copy.json"  # in a local copy: {relative path: [generation, size, mtime_ns]}
_SKIP_SUFFIXES = (".tmp", ".old", ".partial", ".part")  # local work in progress, never uploaded


def is_remote(path: Any) -> bool:
  return isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(SCHEME)


def join(base: str, *parts: str) -> str:
  if is_remote(base):
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])
  return os.path.join(base, *parts)


def exists(path: str) -> bool:
  return gcs.call(path, gcs.filesystem().exists, gcs.key(path)) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return gcs.call(path, gcs.filesystem().isdir, gcs.key(path)) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return gcs.call(path, gcs.filesystem().isfile, gcs.key(path)) if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  """Names directly under `path` ([] when there is nothing)."""
  if not is_remote(path):
    return os.listdir(path) if os.path.isdir(path) else []
  try:
    entries = gcs.call(path, gcs.filesystem().ls, gcs.key(path), detail=False)
  except FileNotFoundError:
    return []
  names = {e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != gcs.key(path)}
  return sorted(n for n in names if not _is_write_probe(n))


def _is_write_probe(name: str) -> bool:
  """Another process's `check_remote_output` probe (an empty object removed at once: a pod's process 1 checks
  the workdir while process 0 pulls it, and a probe listed, then gone, would fail the download): no listing
  holds one."""
  return name.rsplit("/", 1)[-1].startswith(files.WRITE_PROBE_PREFIX)


def top_level_kinds(path: str) -> dict[str, set[str]]:
  """{name: {"file"} / {"folder"}} of what is directly under the folder `path` ({} when it does not exist). In
  a bucket a name may be both (an object `x` and objects under `x/`): {"file", "folder"}."""
  if not is_remote(path):
    if not os.path.isdir(path):
      return {}
    return {e.name: {"folder" if e.is_dir() else "file"} for e in os.scandir(path)}
  kinds: dict[str, set[str]] = {}
  for rel in list_objects(path):
    top, _, rest = rel.partition("/")
    if top:  # "": `path` itself is an object (refused as a workdir before this is asked)
      kinds.setdefault(top, set()).add("folder" if rest else "file")
  return kinds


def read_bytes(path: str) -> bytes:
  if is_remote(path):
    return gcs.call(path, gcs.filesystem().cat_file, gcs.key(path))
  with open(path, "rb") as f:
    return f.read()


def write_bytes(path: str, data: bytes) -> None:
  """Atomic: a bucket object is replaced whole by one upload; a local file by a rename."""
  if is_remote(path):
    gcs.call(path, gcs.filesystem().pipe_file, gcs.key(path), data)
    return
  with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
    f.write(data)


def write_json(path: str, obj: Any) -> None:
  write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def makedirs(path: str) -> None:
  if not is_remote(path):  # a bucket has no folders: a prefix exists once an object is under it
    os.makedirs(path, exist_ok=True)


def remove(path: str) -> None:
  if is_remote(path):
    gcs.call(path, gcs.filesystem().rm, gcs.key(path))
  else:
    os.remove(path)


def move(src: str, dst: str) -> None:
  """A file or folder to a new name (a bucket copies each object, then deletes it)."""
  if is_remote(src):
    gcs.call(src, gcs.filesystem().mv, gcs.key(src), gcs.key(dst), recursive=True)
  else:
    os.replace(src, dst)


def list_objects(url: str) -> dict[str, dict[str, Any]]:
  """{relative path: object info} of every object under the prefix `url` (one object: {"": info}), write probes
  left out (`_is_write_probe`)."""
  fs, key = gcs.filesystem(), gcs.key(url)
  found = gcs.call(url, fs.find, key, detail=True)
  if not found and gcs.call(url, fs.isfile, key):
    found = {key: gcs.call(url, fs.info, key)}
  return {("" if name == key else name[len(key) + 1:]): dict(info, url=SCHEME + name)
          for name, info in found.items()
          if info.get("type") != "directory" and not _is_write_probe(name)}


def object_identity(url: str) -> dict[str, Any]:
  """{"path": url, "size", "crc32c"} of one bucket object, from its metadata (nothing downloaded): what a
  resume compares, the content (a same-size edit too) and not the generation (an unchanged re-upload)."""
  info = list_objects(url).get("")
  if info is None:
    raise FileNotFoundError(f"{url}: no such object in the bucket")
  return {"path": url, "size": int(info["size"]), "crc32c": info.get("crc32c")}


def tree_digests(directory: str, algorithm: str) -> dict[str, str]:
  """{relative path: digest} of every file under `directory`: "sha256" (local files) or "crc32c" (what a
  bucket keeps for every object, so checking a checkpoint there downloads nothing)."""
  if is_remote(directory):
    objects = list_objects(directory)
    if algorithm == "crc32c":
      return dict(sorted((rel, info["crc32c"]) for rel, info in objects.items()))
    return dict(sorted((rel, hashlib.sha256(read_bytes(join(directory, rel))).hexdigest()) for rel in objects))
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      out[os.path.relpath(path, directory)] = (files.sha256_file(path) if algorithm == "sha256" else
                                               crc32c_file(path))
  return dict(sorted(out.items()))


def crc32c_file(path: str) -> str:
  """A file's crc32c as GCS reports it (base64 of the big-endian 4 bytes)."""
  import google_crc32c  # pylint: disable=g-import-not-at-top
  checksum = google_crc32c.Checksum()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      checksum.update(block)
  return base64.b64encode(checksum.digest()).decode()


def cache_root() -> str:
  return os.path.join(cache.cache_dir(), "bucket")


def copy_path(url: str, area: str = "copies") -> str:
  """Where `local(url)` keeps its copy: `$ELMO_JAX_CACHE/bucket/copies/<bucket>/<object path>` (other areas:
  "workdirs" for a run's `Mirror`, "staged" for outputs on their way up)."""
  try:
    return outside_names.inside(os.path.join(cache_root(), area), gcs.key(url), f"the bucket path {url}")
  except outside_names.OutsideNameError as e:
    raise StorageError(str(e)) from None


def local(path: str | os.PathLike, names: Iterable[str] | None = None) -> str:
  """`path` itself when local; for a bucket URL, a local copy of the object or of every object under it
  (with `names`: under those top-level names only), brought up to date with the bucket (only what changed
  is downloaded)."""
  text = os.fspath(path)
  if not is_remote(text):
    return text
  target = copy_path(text)
  objects = list_objects(text)
  if names is not None:
    names = set(names)
    objects = {rel: info for rel, info in objects.items() if rel.split("/")[0] in names}
  if not objects:
    raise FileNotFoundError(f"{text}: no such object or folder in the bucket")
  if "" in objects:  # a single object
    sync(os.path.dirname(target), {os.path.basename(target): objects[""]})
  else:
    sync(target, objects, delete=lambda top: names is None or top in names)
  return target


def read_record(folder: str) -> dict[str, list]:
  try:
    with open(os.path.join(folder, RECORD)) as f:
      record = json.load(f)
    return record if isinstance(record, dict) else {}
  except (OSError, ValueError):
    return {}


def file_stamp(path: str) -> list[int]:
  st = os.stat(path)
  return [st.st_size, st.st_mtime_ns]


def _unchanged(folder: str, rel: str, generation: Any, record: dict[str, list]) -> bool:
  """The local copy of `rel` is the bucket's generation and nothing touched it since."""
  path = os.path.join(folder, rel)
  entry = record.get(rel)
  return (isinstance(entry, list) and len(entry) == 3 and entry[0] == str(generation) and os.path.isfile(path)
          and file_stamp(path) == entry[1:])


def sync(folder: str, objects: dict[str, dict[str, Any]],
          delete: Callable[[str], bool] | None = None) -> None:
  """Makes `folder` hold `objects` (relative path -> info, from `list_objects`): downloads what is new or
  changed, each checked against its crc32c before it replaces the old copy; removes the local files the
  bucket does not have whose top-level name `delete(name)` says is the bucket's to decide."""
  os.makedirs(folder, exist_ok=True)
  record = read_record(folder)
  fs = gcs.filesystem()
  for rel, info in sorted(objects.items()):
    if _unchanged(folder, rel, info.get("generation"), record):
      continue
    try:  # an object's name is a name: `corp/../../x` must not land outside the copy
      target = outside_names.inside(folder, rel, f"the bucket object {info['url']}:")
    except outside_names.OutsideNameError as e:
      raise StorageError(str(e)) from None
    with files.atomic_path(target, suffix=".part") as tmp:
      gcs.call(info["url"], fs.get_file, gcs.key(info["url"]), tmp)
      if "crc32c" in info and crc32c_file(tmp) != info["crc32c"]:
        raise StorageError(f"{info['url']}: the download does not match the object's crc32c; run again")
      if isinstance(info.get("mtime"), datetime.datetime):  # the object's time: the same copy on every host
        stamp = int(info["mtime"].timestamp() * 1e9)
        os.utime(tmp, ns=(stamp, stamp))
    record[rel] = [str(info.get("generation")), *file_stamp(target)]
  if delete is not None:
    for path in list(local_files(folder)):
      rel = os.path.relpath(path, folder).replace(os.sep, "/")
      if rel not in objects and delete(rel.split("/")[0]):
        os.remove(path)
        record.pop(rel, None)
  files.write_json(os.path.join(folder, RECORD), record)


def upload(local_path: str, url: str) -> None:
  """A local file, or every file under a local folder (`local_files`), to `url` (one object per file)."""
  fs = gcs.filesystem()
  if os.path.isfile(local_path):
    gcs.call(url, fs.put_file, local_path, gcs.key(url))
    return
  for path in local_files(local_path):
    target = join(url, *os.path.relpath(path, local_path).split(os.sep))
    gcs.call(target, fs.put_file, path, gcs.key(target))


def local_files(path: str) -> Iterator[str]:
  """Every file under `path` (or `path` itself) that a bucket should hold: work in progress (`_SKIP_SUFFIXES`,
  an atomic writer's folders) and the copy's record left out."""
  if os.path.isfile(path):
    yield path
    return
  skip = lambda name: name.endswith(_SKIP_SUFFIXES) or files.WRITER_MARK in name  # noqa: E731
  for root, dirs, names in os.walk(path):
    dirs[:] = sorted(d for d in dirs if not skip(d))
    for name in sorted(names):
      if not skip(name) and name != RECORD:
        yield os.path.join(root, name)


def check_output(path: str | os.PathLike, what: str, *, inputs: Any = (), directory: bool = False,
                 replaces: bool = False, owns: tuple[str, ...] = ()) -> None:
  """Refuses an output path that is unsafe or cannot be written, before any work, in one line naming `what`
  (raises files.UnsafeOutputError): `files.check_output`'s rules for a local path, `check_remote_output`'s
  (the same rules, and a write probe) for a bucket URL."""
  raw = os.fspath(path)
  if not is_remote(raw):
    files.check_output(raw, what, inputs=inputs, directory=directory, replaces=replaces, owns=owns)
    return
  try:
    check_remote_output(raw, what, inputs=[inputs] if isinstance(inputs, (str, os.PathLike)) else inputs,
                        directory=directory, replaces=replaces, run_folders=RUN_FOLDERS)
  except StorageError as e:
    raise files.UnsafeOutputError(str(e)) from None


def check_remote_output(url: str, what: str, *, inputs: Iterable[Any] = (), directory: bool = False,
                        replaces: bool = False, run_folders: Iterable[str] = ()) -> None:
  """`files.check_output`'s rules for a bucket URL, in one line naming `what` (raises StorageError): not one
  of the bucket `inputs` (nor, with `replaces`, a folder holding one), not inside a trained run's
  `run_folders` (a prefix with config.json beside them), and the bucket exists and takes a write (a probe
  object is written and deleted: listing rights alone do not show that a write will be accepted)."""
  check_url(url, what)
  target = url.rstrip("/")
  for item in inputs:
    source = os.fspath(item).rstrip("/") if is_remote(item) else None
    if source == target:
      raise StorageError(f"{what}={url} is an input of this run; writing it would destroy it")
    if replaces and source and source.startswith(target + "/"):
      raise StorageError(f"{what}={url} holds an input of this run ({item}), and is replaced whole")
  parts = target.split("/")  # "gs:", "", bucket, name, ...
  for i in range(3, len(parts) if directory else len(parts) - 1):
    run = "/".join(parts[:i])
    if parts[i] in run_folders and exists(join(run, CONFIG_FILE)):
      raise StorageError(f"{what}={url} is inside the trained run {run}'s {parts[i]}/ folder, which other "
                         "commands read; write elsewhere")
  bucket = gcs.key(url).split("/")[0]
  if not bucket:
    raise StorageError(f"{what}={url}: no bucket named")
  fs = gcs.filesystem()
  if not gcs.call(f"{what}={url}", fs.exists, bucket):
    raise StorageError(f"{what}={url}: the bucket gs://{bucket} does not exist (or is not visible to these "
                       "credentials)")
  folder = target if directory else target.rsplit("/", 1)[0]
  probe = join(folder, f"{files.WRITE_PROBE_PREFIX}{os.getpid()}-{time.time_ns()}")
  gcs.call(f"{what}={url}: the bucket refuses writes", fs.pipe_file, gcs.key(probe), b"")
  gcs.call(f"{what}={url}", fs.rm, gcs.key(probe))


@contextlib.contextmanager
def staged_output(path: str | os.PathLike, what: str, *, directory: bool = False,
                  inputs: Iterable[Any] = ()) -> Iterator[str]:
  """Yields where to write the output `path`: itself when local (its caller checks it as before); for a
  bucket URL, checked first (`check_output` against `inputs`), a fixed local staging path in
  `$ELMO_JAX_CACHE/bucket/staged/` (a rerun after an interruption finds its work there), uploaded (each
  file one object) and removed once the block finished without error: the bucket never holds a partial
  output. Raises files.UnsafeOutputError for a URL that is refused."""
  text = os.fspath(path)
  if not is_remote(text):
    yield text
    return
  check_output(text, what, inputs=inputs, directory=directory)
  staging = copy_path(text, "staged")
  os.makedirs(staging if directory else os.path.dirname(staging), exist_ok=True)
  yield staging
  upload(staging, text)
  if os.path.isdir(staging):
    shutil.rmtree(staging, ignore_errors=True)
  elif os.path.exists(staging):
    os.remove(staging)
