"""Model archives (`.zip`, `.tar.gz`, `.tar.bz2`, ...) by URL or path: downloaded, unpacked once, checked.

    folder = archive.model_folder("http://vectors.nlpl.eu/repository/20/199.zip")

The archive itself comes through `download.cached_path` (verified, cached; it must open as a zip or tar
archive, so an HTML error page is never cached). An archive is verified whole before it is trusted
(`verify`): a fresh download before it is cached, any archive before it is unpacked: read to its end (a
gzip/bz2/xz stream's checksum and trailer, every tar header, every zip member's CRC), within bounds (it may
unpack to at most `MAX_RATIO` times its size, at least `MIN_ALLOWANCE`, at most `MAX_UNPACKED` bytes), and
every codec's error (an encrypted or deflate64 zip member, a broken stream) is one line. It is unpacked
into `CACHE/archives/<sha256[:16]>-<name>/`, named by the archive's content, so a rerun, a second process
or an offline run reuses it, and a changed archive gets a folder of its own. Unpacking writes into a
temporary folder beside it, renamed into place when every member is written; several processes take a
lock, and a killed one's temporary folder is removed by the next. The lock file (`.KEY.lock`) also holds
what was unpacked (each file's size and sha256), checked on every reuse: a folder edited or lost since is
unpacked again, not trusted because it exists. Every member is checked before anything is written: a name
that is absolute or climbs out (`..`), a symbolic or hard link, a device, FIFO or socket is refused in one
line naming the member, and nothing stays behind.

`model_folder` then steps into the folder an archive wraps its files in (a top folder alone, as most
zips have; `__MACOSX/` and dot files aside) and returns it for `resolve.resolve_model` to read as any
local folder: which format a folder holds is decided there, not here.
"""
from __future__ import annotations

import bz2
import contextlib
import fcntl
import glob
import gzip
import json
import lzma
import os
import shutil
import stat
import struct
import tarfile
import tempfile
import urllib.parse
import zipfile
import zlib
from typing import IO, Iterator

from elmo_jax.formats import checks
from elmo_jax.runtime import files
from elmo_jax.runtime import outside_names
from elmo_jax.runtime.cache import ARCHIVES, cache_dir
from elmo_jax.sources import download

SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar")
# What an archive may unpack to: MAX_RATIO times its own size (model files compress ~1.1x; a bomb ~1000x),
# but always MIN_ALLOWANCE (a small archive of small files) and never more than MAX_UNPACKED.
MAX_RATIO = 100
MIN_ALLOWANCE = 64 << 20
MAX_UNPACKED = 32 << 30
# How many members an archive may hold: a model is a handful of files (a TF-Hub module 4, an EFML folder 6-7);
# 300,000 tiny files within the byte allowance would fill the cache's inodes and stay there.
MAX_MEMBERS = 10_000
_ZIP_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
_STREAMS = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ\x00": lzma.open}
# What a codec, zipfile or tarfile raises for a damaged archive (each becomes one line).
CODEC_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, zipfile.BadZipFile, RuntimeError,
                NotImplementedError, ValueError, struct.error)


class ArchiveError(download.DownloadError):
  """An archive that cannot be unpacked safely or holds no model; the message is one line."""


def is_archive(spec: str | os.PathLike) -> bool:
  """Whether a URL's or path's file name is an archive's (`SUFFIXES`)."""
  text = os.fspath(spec)
  name = urllib.parse.urlparse(text).path if download.is_url(text) else text
  return name.lower().endswith(SUFFIXES)


def _not_archive(path: str) -> str | None:
  """`cached_path`'s check of a download: why it is no zip or tar archive, else None (by its first bytes:
  a cut or damaged one is `verify`'s to name)."""
  if zipfile.is_zipfile(path):
    return None
  with open(path, "rb") as f:
    head = f.read(6)
  if any(head.startswith(magic) for magic in _STREAMS):
    return None
  try:
    if tarfile.is_tarfile(path):
      return None
  except (OSError, tarfile.TarError):
    pass
  return f"not a zip or tar archive ({files.looks_like(path)})"


def allowance(archive_bytes: int) -> int:
  """How many bytes an archive of `archive_bytes` may unpack to (module constants)."""
  return min(MAX_UNPACKED, max(MAX_RATIO * archive_bytes, MIN_ALLOWANCE))


def _too_big(total: str, size: int) -> str:
  return (f"an archive that would unpack to {total} bytes, more than {allowance(size):,} ({MAX_RATIO}x its "
          f"{size:,} bytes, at least {MIN_ALLOWANCE:,}, at most {MAX_UNPACKED:,}: archive.MAX_RATIO / "
          "MAX_UNPACKED); refused as a decompression bomb")


def _too_many(count: str) -> str:
  return (f"an archive of {count} members, more than the {MAX_MEMBERS:,} a model's may hold (archive.MAX_MEMBERS); "
          "refused before unpacking")


def verify(path: str) -> str | None:
  """Why `path` is not a whole zip or tar archive within its `allowance`, else None (module docstring)."""
  try:
    if zipfile.is_zipfile(path):
      return _verify_zip(path)
    with open(path, "rb") as f:
      head = f.read(6)
    opener = next((o for magic, o in _STREAMS.items() if head.startswith(magic)), None)
    if opener is None and not tarfile.is_tarfile(path):
      return f"not a zip or tar archive ({files.looks_like(path)})"
    return _verify_tar(path, opener)
  except CODEC_ERRORS as e:
    return f"not a whole archive ({type(e).__name__}: {checks.one_line(e, 120)}; corrupt or truncated)"


def _verify_zip(path: str) -> str | None:
  """Every member's sizes within the allowance (by the central directory, before inflating one), then every
  member inflated (at most its stated size) and its CRC checked."""
  size = os.path.getsize(path)
  with zipfile.ZipFile(path) as z:
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:  # by the central directory, before a member is read
      return _too_many(f"{len(infos):,}")
    total = sum(i.file_size for i in infos)
    if total > allowance(size):
      return _too_big(f"{total:,}", size)
    for info in infos:
      if info.flag_bits & 0x1:
        return f"an archive whose member {info.filename!r} is encrypted (a model's must not need a password)"
      if info.compress_type not in _ZIP_METHODS:
        method = {9: "deflate64", 12: "bzip2", 14: "lzma", 93: "zstandard"}.get(info.compress_type, "unknown")
        return (f"an archive whose member {info.filename!r} uses zip compression method {info.compress_type} "
                f"({method}), which Python's zipfile cannot read; repack it with plain deflate (zip -r)")
      with z.open(info) as f:
        while f.read(1 << 20):
          pass
  return None


def _verify_tar(path: str, opener) -> str | None:
  """The compressed stream read to its end (its checksum and trailer; stopped past the allowance), then every
  tar header read; a plain tar's members must end inside the file."""
  size, n = os.path.getsize(path), os.path.getsize(path)
  if opener is not None:
    n = 0
    with opener(path, "rb") as f:
      while True:
        block = f.read(1 << 20)
        if not block:
          break
        n += len(block)
        if n > allowance(size):
          return _too_big(f"more than {n:,}", size)
  total = end = count = 0
  with tarfile.open(path, "r:*") as t:
    for m in t:
      total, end, count = total + m.size, max(end, m.offset_data + m.size), count + 1
      if count > MAX_MEMBERS:  # stopped there: tarfile keeps every header it has read
        return _too_many(f"more than {MAX_MEMBERS:,}")
  if total > allowance(size):
    return _too_big(f"{total:,}", size)
  if end > n:
    return f"a truncated archive (a member ends at byte {end:,} of {n:,})"
  return None


def _stem(path: str) -> str:
  name = os.path.basename(path)
  for suffix in SUFFIXES:
    if name.lower().endswith(suffix):
      return name[: -len(suffix)] or "archive"
  return name


def _member_path(archive: str, name: str) -> list[str]:
  """The path parts a member `name` writes below the unpack folder (`outside_names.name_parts`: the one check of a
  name from outside); refuses names that leave it."""
  try:
    return outside_names.name_parts(name, f"{archive}: member")
  except outside_names.OutsideNameError as e:
    raise ArchiveError(f"{e}; refusing to unpack the archive") from None


def _members(archive: str) -> Iterator[tuple[list[str], bool, contextlib.AbstractContextManager[IO[bytes]]]]:
  """(path parts, is a folder, opener of its bytes) of every member, in archive order; links,
  devices and other special members are refused (ArchiveError) before the first is yielded."""
  if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
      infos = z.infolist()
      for info in infos:
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if info.create_system == 3 and kind not in (0, stat.S_IFREG, stat.S_IFDIR):
          what = "a symbolic link" if kind == stat.S_IFLNK else "a device or other special file"
          raise ArchiveError(f"{archive}: member {info.filename!r} is {what}; refusing to unpack the archive")
      checked = [(_member_path(archive, info.filename), info.is_dir()) for info in infos]
      for (parts, is_dir), info in zip(checked, infos):
        yield parts, is_dir, (contextlib.nullcontext() if is_dir else z.open(info))
    return
  with tarfile.open(archive, "r:*") as t:
    members = t.getmembers()
    for m in members:
      if not (m.isfile() or m.isdir()):
        what = ("a symbolic link" if m.issym() else "a hard link" if m.islnk()
                else "a device" if m.isdev() and not m.isfifo() else "a FIFO" if m.isfifo() else "a special file")
        raise ArchiveError(f"{archive}: member {m.name!r} is {what}; refusing to unpack the archive")
    checked = [(_member_path(archive, m.name), m.isdir()) for m in members]
    for (parts, is_dir), m in zip(checked, members):
      yield parts, is_dir, (contextlib.nullcontext() if is_dir else t.extractfile(m))


def _unpack(archive: str, into: str) -> None:
  """Every member of `archive` below the (existing, empty) folder `into`, at most its `allowance` of bytes
  (whatever its headers say). Raises ArchiveError."""
  size = os.path.getsize(archive)
  left = allowance(size)
  try:
    for parts, is_dir, opener in _members(archive):
      if not parts:
        continue
      dest = os.path.join(into, *parts)
      if is_dir:
        os.makedirs(dest, exist_ok=True)
        continue
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      n = 0
      with opener as src, open(dest, "wb") as out:
        while block := src.read(1 << 20):
          n += len(block)
          if n > left:
            raise ArchiveError(f"{archive}: cannot unpack it ({_too_big(f'more than {allowance(size):,}', size)})")
          out.write(block)
      left -= n
  except CODEC_ERRORS as e:
    if isinstance(e, ArchiveError):
      raise
    raise ArchiveError(f"{archive}: cannot unpack it ({type(e).__name__}: {checks.one_line(e)})") from None


def _unpacked_files(folder: str) -> dict[str, list]:
  """{relative path: [bytes, sha256]} of the files below `folder` now (a link counts as a file that differs)."""
  out = {}
  for top, dirs, names in os.walk(folder):
    dirs.sort()
    for name in names:
      path = os.path.join(top, name)
      rel = os.path.relpath(path, folder).replace(os.sep, "/")
      out[rel] = [-1, ""] if os.path.islink(path) else [os.path.getsize(path), files.sha256_file(path)]
  return out


def _intact(folder: str, lock) -> bool:
  """Whether `folder` holds exactly what was unpacked into it (the manifest in the lock file `lock`)."""
  if not os.path.isdir(folder):
    return False
  lock.seek(0)
  try:
    manifest = json.loads(lock.read() or "null")
  except ValueError:
    return False
  return isinstance(manifest, dict) and manifest.get("files") == _unpacked_files(folder)


def unpacked(spec: str | os.PathLike, *, cache: str | None = None) -> str:
  """The folder the archive `spec` (URL or local path) is unpacked into, unpacked on first use.

  Raises DownloadError (the download) or ArchiveError (one line naming the archive and the member)."""
  text = os.fspath(spec)
  path = download.cached_path(text, cache=cache, validate=_not_archive, verify=verify)
  if not os.path.isfile(path):
    raise ArchiveError(f"{text}: no such archive file")
  problem = _not_archive(path)
  if problem is not None:
    raise ArchiveError(f"{text}: {problem}")
  root = download.make_dir(os.path.join(os.path.abspath(cache or cache_dir()), ARCHIVES))
  key = f"{files.sha256_file(path)[:16]}-{_stem(path)}"
  folder = os.path.join(root, key)
  with open(os.path.join(root, f".{key}.lock"), "a+") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if _intact(folder, lock):  # unpacked before (by this process or another), unchanged since
      return folder
    problem = verify(path)
    if problem is not None:
      raise ArchiveError(f"{text}: cannot unpack it ({problem})")
    # Under the lock no other process unpacks this archive: a temporary folder is a killed one's leftover.
    for stale in glob.glob(os.path.join(glob.escape(root), f".{glob.escape(key)}.tmp-*")):
      shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root)
    try:
      _unpack(path, tmp)
      written = _unpacked_files(tmp)
      os.chmod(tmp, 0o777 & ~files.current_umask())
      if os.path.lexists(folder):  # edited or damaged since it was unpacked: replaced, not trusted
        os.rename(folder, tmp + ".stale")
        _remove(tmp + ".stale")
      os.rename(tmp, folder)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps({"archive": os.path.basename(path), "files": written}))
    lock.flush()
  return folder


def _remove(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    os.remove(path)


def model_folder(spec: str | os.PathLike, *, cache: str | None = None) -> str:
  """`unpacked(spec)`, stepped into while it holds one folder and nothing else (`__MACOSX/`, dot files
  aside). Raises DownloadError / ArchiveError (an empty archive)."""
  folder = unpacked(spec, cache=cache)
  while True:
    entries = [e for e in os.listdir(folder) if not e.startswith(".") and e != "__MACOSX"]
    if not entries:
      raise ArchiveError(f"{os.fspath(spec)}: the archive holds no files")
    if len(entries) == 1 and os.path.isdir(os.path.join(folder, entries[0])):
      folder = os.path.join(folder, entries[0])
      continue
    return folder


__all__ = ["ArchiveError", "SUFFIXES", "is_archive", "model_folder", "unpacked"]
