"""Local files: atomic writes (a reader, or a crash, never sees a half-written file), what a file is from its
first bytes, whether an output path may be written (and has room), and content hashes."""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
from typing import Any, Callable, Iterator

import numpy as np

from elmo_jax.runtime import cache
from elmo_jax.runtime.outside_names import within
from elmo_jax.runtime.run_layout import CONFIG_FILE, RUN_FOLDERS

# The name prefix of the probes that check an output folder can be written (removed at once, here and in a
# bucket: storage.check_remote_output); a listing of a folder another process writes to leaves them out.
WRITE_PROBE_PREFIX = ".write-test-"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp", prefix: str | None = None) -> Iterator[str]:
  """Yields a temporary path beside `path`; renamed onto it on success, removed on failure.

  The temp file is named `prefix` (default `NAME.`) + random + `suffix`, in the same directory so the
  rename is atomic (never a copy across file systems), and gets the permissions a plainly created file
  would (the umask's), not mkstemp's 0600.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix or os.path.basename(path) + ".", suffix=suffix)
  os.close(fd)
  os.chmod(tmp, 0o666 & ~current_umask())
  try:
    yield tmp
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def current_umask() -> int:
  """The process's umask (read by setting it and back: there is no getter)."""
  umask = os.umask(0)
  os.umask(umask)
  return umask


# The mark in the names of the temporary folders `atomic_dir` creates (hidden, beside the target, with the host
# and process that own them): nothing else is ever named so, so a killed writer's leftovers are known as such.
WRITER_MARK = "elmo-jax-writing"


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[str]:
  """`atomic_path` for a folder: yields an empty folder beside `path`, swapped in for `path` on success.

  A reader sees the old folder or the new one, never a mix; on failure the temporary folder is removed. The
  temporary names belong to this writer (`.NAME.elmo-jax-writing-HOST.PID.xxxx` and its `-old` twin): a
  user's `NAME.tmp/` or `NAME.old/` beside `path` is never touched, and only a dead writer's leftovers of this
  very name are cleared. The folder gets the mode `mkdir` would give it (0777 less the umask), not mkdtemp's
  0700: a model written for others is readable by them. A `path` that is a symlink is written through: the
  folder it names (resolved, as `check_output` resolves it) is replaced and the link stays as it is.
  """
  final = os.path.realpath(path)
  parent, name = os.path.dirname(final), os.path.basename(final)
  head = f".{name}.{WRITER_MARK}-{socket.gethostname()}."
  os.makedirs(parent, exist_ok=True)
  remove_dead_temps(parent, head, "")
  tmp = tempfile.mkdtemp(dir=parent, prefix=f"{head}{os.getpid()}.")
  os.chmod(tmp, 0o777 & ~current_umask())
  old = tmp + "-old"
  try:
    yield tmp
    if os.path.lexists(final):
      os.replace(final, old)
    os.replace(tmp, final)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  shutil.rmtree(old, ignore_errors=True)


def remove_dead_temps(directory: str, head: str, tail: str = ".tmp") -> list[str]:
  """Removes the entries of `directory` named `HEAD<pid>.<anything>TAIL` whose process `pid` (on this host:
  `head` names it) no longer runs, files or folders; returns their names. What a killed writer left."""
  removed = []
  for entry in (os.listdir(directory) if os.path.isdir(directory) else []):
    if not (entry.startswith(head) and entry.endswith(tail)):
      continue
    pid = entry[len(head):].split(".", 1)[0]
    if not pid.isdigit() or _alive(int(pid)):
      continue
    path = os.path.join(directory, entry)
    try:
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
      removed.append(entry)
    except OSError:
      pass
  return removed


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def write_text(path: str | os.PathLike, text: str) -> None:
  with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
    f.write(text)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
  write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def looks_like(path: str | os.PathLike) -> str:
  """What a file is, from its first bytes, for messages about a file of the wrong kind:
  'a directory', 'an HDF5 file', 'a JSON file', 'an empty file', 'an HTML page' (a server's error or login
  page saved where a model belongs), 'a text file' or 'binary data'."""
  if os.path.isdir(path):
    return "a directory"
  with open(path, "rb") as f:
    head = f.read(512)
  if not head:
    return "an empty file"
  if head.startswith(_HDF5_MAGIC):
    return "an HDF5 file"
  if head.lstrip()[:1] in (b"{", b"["):
    return "a JSON file"
  if head.lstrip()[:14].lower().startswith((b"<!doctype html", b"<html")):
    return "an HTML page"
  try:
    head.decode("utf-8")
  except UnicodeDecodeError as e:
    if e.start < len(head) - 4:  # not just a character cut at the 512-byte boundary
      return "binary data"
  return "a text file"


def text_problem(path: str | os.PathLike) -> str | None:
  """Why `path` cannot be a text corpus ('is an HDF5 file, not text', ...), from its first bytes (a `.gz`
  file's decompressed ones); None for text. One check for every command that reads sentences."""
  path = os.fspath(path)
  if os.path.isdir(path):
    return "is a directory, not a text file"
  try:
    with open(path, "rb") as f:
      gzipped = f.read(2) == b"\x1f\x8b"  # by its magic number, whatever its name (a spooled pipe has none)
    with (gzip.open if gzipped else open)(path, "rb") as f:
      head = f.read(4096)
  except (OSError, EOFError) as e:
    return f"cannot be read ({e})"
  return head_problem(head)


def head_problem(head: bytes) -> str | None:
  """`text_problem` of a text's first bytes (decompressed): a file's first 4 KiB, a stream's first block."""
  if head.startswith(_HDF5_MAGIC):
    return "is an HDF5 file, not text"
  if b"\x00" in head:
    return "holds NUL bytes: binary data, not text"
  try:
    head.decode("utf-8")
  except UnicodeDecodeError as e:
    if e.start < len(head) - 4:  # not just a character cut at the block boundary
      return f"is not UTF-8 text (byte {e.start} is {head[e.start:e.start + 1]!r}): binary data?"
  return None


def is_stream(path: str | os.PathLike) -> bool:
  """A pipe (`<(zcat x.gz)`), a FIFO or a device: bytes that can be read once (a command that must read its
  input twice spools it or refuses it in one line)."""
  try:
    mode = os.stat(path).st_mode
  except OSError:
    return False
  return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


class UnsafeOutputError(ValueError):
  """An output path that cannot be written, or whose writing would destroy an input; one line."""


def _nearest_existing(path: str) -> str:
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return path


def check_output(path: str | os.PathLike, what: str, *, inputs: Any = (), directory: bool = False,
                 replaces: bool = False, owns: tuple[str, ...] = ()) -> None:
  """A local output path's checks (`storage.check_output` takes bucket URLs too, and is what commands call).
  Refuses, in one line naming `what` (e.g. '--output_file'), an output path that
  - is of the wrong kind (a directory for a file, a file for a directory) or cannot be created there
    (missing parent of a file, read-only folder);
  - is, or resolves to (links included), one of `inputs` (the run's input, options, weight, vocab files);
  - lies in a trained run's `checkpoints/` or `export/` folder (other runs read them);
  - with `replaces` (a folder swapped in whole): holds one of `inputs`;
  - with `owns` (the names a writer keeps in the folder, e.g. a run's config.json, vocab.txt, lexicon/): holds
    one of `inputs` at one of them, or inside one.
  Checked before any work, so nothing is written when it fails. Raises UnsafeOutputError."""
  raw = os.fspath(path)
  if not raw.strip():
    raise UnsafeOutputError(f"{what} is empty; give a path")
  real = os.path.realpath(raw)
  if directory and os.path.exists(real) and not os.path.isdir(real):
    raise UnsafeOutputError(f"{what}={raw} is a file, not a directory")
  if not directory and os.path.isdir(real):
    raise UnsafeOutputError(f"{what}={raw} is a directory; give a file path")
  if not directory and not os.path.isdir(os.path.dirname(real)):
    raise UnsafeOutputError(f"{what}={raw}: its directory {os.path.dirname(real)} does not exist")
  for item in ([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs):
    if not item or not os.path.exists(item):
      continue
    source = os.path.realpath(item)
    if source == real or (os.path.exists(real) and os.path.samefile(source, real)):
      raise UnsafeOutputError(f"{what}={raw} is an input of this run ({item}); writing it would destroy it")
    if replaces and within(source, real):
      raise UnsafeOutputError(f"{what}={raw} holds an input of this run ({item}), and is replaced whole")
    for name in owns:
      if within(source, os.path.join(real, name)):
        raise UnsafeOutputError(f"{what}={raw} holds an input of this run ({item}) where it writes its {name}; "
                                f"writing it would destroy it: give another {what}")
  for folder in RUN_FOLDERS:  # a trained run's folder: WORKDIR/{checkpoints,export} beside config.json
    parts = real.split(os.sep)
    for i, part in enumerate(parts[:-1] if not directory else parts):
      run = os.sep.join(parts[:i]) or os.sep
      if part == folder and os.path.isfile(os.path.join(run, CONFIG_FILE)):
        raise UnsafeOutputError(f"{what}={raw} is inside the trained run {run}'s {folder}/ folder, which "
                                "other commands read; write elsewhere")
  existing = _nearest_existing(real if directory else os.path.dirname(real))
  if not os.path.isdir(existing):
    raise UnsafeOutputError(f"{what}={raw}: {existing} is a file, not a directory")
  longest = max(real.split(os.sep), key=len)
  if len(longest.encode()) > os.pathconf(existing, "PC_NAME_MAX"):
    raise UnsafeOutputError(f"{what}={raw[:60]}...: a name of {len(longest.encode())} bytes is longer than this "
                            f"file system allows ({os.pathconf(existing, 'PC_NAME_MAX')})")
  try:  # a real probe: access() says yes to root on a read-only folder, and to anyone on some file systems
    os.rmdir(tempfile.mkdtemp(dir=existing, prefix=WRITE_PROBE_PREFIX))
  except OSError as e:
    raise UnsafeOutputError(f"{what}={raw}: {existing} is not writable ({e.strerror})") from None


def check_room(folder: str | os.PathLike, need: int, largest: int, what: str) -> None:
  """Refuses (UnsafeOutputError, one line) a write of about `need` bytes into `folder` (its largest file
  `largest`) that the disk's free space or the file-size limit (ulimit -f) cannot take: checked before the
  first byte, since a library that writes in place (HDF5) cannot recover from a full disk."""
  import resource  # pylint: disable=g-import-not-at-top
  where = _nearest_existing(os.path.abspath(os.fspath(folder)))
  free = shutil.disk_usage(where).free
  if free < need:
    raise UnsafeOutputError(f"{what}={os.fspath(folder)}: needs about {human_bytes(need)} free in {where}, "
                            f"{human_bytes(free)} are free; make room or write elsewhere")
  limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
  if limit != resource.RLIM_INFINITY and largest > limit:
    raise UnsafeOutputError(f"{what}={os.fspath(folder)}: a file of about {human_bytes(largest)} is over this "
                            f"process's file-size limit ({human_bytes(limit)}, ulimit -f)")


def first_difference(saved: dict, wanted: dict, prefix: str = "") -> str:
  """'a.b is 1 there, 2 here' for the first key (nested dicts by dotted path) where two settings differ;
  "" if they agree. For refusing a run whose saved state was made with other settings."""
  for key in sorted(set(saved) | set(wanted)):
    was = saved.get(key)
    now = wanted.get(key)
    if isinstance(was, dict) and isinstance(now, dict):
      found = first_difference(was, now, f"{prefix}{key}.")
      if found:
        return found
    elif was != now:
      return f"{prefix}{key} is {json.dumps(was)[:80]} there, {json.dumps(now)[:80]} here"
  return ""


def sha256_arrays(*arrays: Any, extra: Any = None) -> str:
  """sha256 of JSON `extra` and the dtypes, shapes and bytes of `arrays` (e.g. a model's params)."""
  digest = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
  for array in arrays:
    array = np.ascontiguousarray(np.asarray(array))
    digest.update(f"{array.dtype}{array.shape}".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def human_bytes(n: float) -> str:
  """A size for a message: '1.5 GB', '12.0 MB', '3.2 kB', '512 bytes'."""
  for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{int(n)} bytes"


def gigabytes(n: float | None) -> str:
  """A size in one fixed unit, for reports whose rows are compared: '1.23 GB' ('?' for None)."""
  return "?" if n is None else f"{n / 1e9:.2f} GB"


def sha256_file(path: str | os.PathLike, on_block: Callable[[int], Any] | None = None) -> str:
  """sha256 hex digest of a file's bytes, read in 4 MiB blocks; `on_block(n)` after each (a progress bar)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
      if on_block is not None:
        on_block(len(block))
  return digest.hexdigest()


def stat_key(st: os.stat_result) -> dict[str, int]:
  """What a hash cache trusts: a file whose size, mtime and ctime are unchanged has unchanged bytes. ctime (the
  inode change time) moves on every write and cannot be set back, not even by os.utime."""
  return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def cached_sha256(path: str | os.PathLike) -> str:
  """`sha256_file(path)`, remembered in `$ELMO_JAX_CACHE/sha256/` with the file's `stat_key`: an unchanged
  file (a training text at every start) is hashed once, an edited one (its ctime moved) again. A cache
  that cannot be written costs a hash next time, nothing else."""
  real = os.path.realpath(path)
  record = os.path.join(cache.cache_dir(), "sha256", hashlib.sha256(real.encode()).hexdigest()[:16] + ".json")
  before = stat_key(os.stat(real))
  try:
    with open(record, encoding="utf-8") as f:
      saved = json.load(f)
    if saved == {"path": real, **before, "sha256": saved.get("sha256")} and isinstance(saved["sha256"], str):
      return saved["sha256"]
  except (OSError, ValueError, AttributeError, TypeError):
    pass
  digest = sha256_file(real)
  if stat_key(os.stat(real)) == before:  # not written while it was read
    try:
      os.makedirs(os.path.dirname(record), exist_ok=True)
      write_json(record, {"path": real, **before, "sha256": digest})
    except OSError:
      pass
  return digest
