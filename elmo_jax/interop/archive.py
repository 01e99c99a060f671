"""Model archives (`.zip`, `.tar.gz`, `.tar.bz2`, ...) by URL or path: downloaded, unpacked once, checked.

    folder = archive.model_folder("http://vectors.nlpl.eu/repository/20/199.zip")

The archive itself comes through `download.cached_path` (verified, cached; it must open as a zip or tar
archive, so an HTML error page is never cached). It is unpacked into `CACHE/archives/<sha256[:16]>-<name>/`,
named by the archive's content, so a rerun, a second process or an offline run reuses it, and a changed
archive gets a folder of its own. Unpacking writes into a temporary folder beside it, renamed into place
when every member is written; several processes take a lock, and a killed one's temporary folder is
removed by the next. Every member is checked before anything is written: a name that is absolute or
climbs out (`..`), a symbolic or hard link, a device, FIFO or socket is refused in one line naming the
member, and nothing stays behind.

`model_folder` then steps into the folder an archive wraps its files in (a top folder alone, as most
zips have; `__MACOSX/` and dot files aside) and returns it for `pretrained.resolve_model` to read as any
local folder: which format a folder holds is decided there, not here.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import stat
import tarfile
import tempfile
import urllib.parse
import zipfile
from typing import IO, Iterator

from elmo_jax.interop import checks
from elmo_jax.interop import download
from elmo_jax.runtime import files
from elmo_jax.runtime.cache import ARCHIVES, cache_dir

SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar")


class ArchiveError(download.DownloadError):
  """An archive that cannot be unpacked safely or holds no model; the message is one line."""


def is_archive(spec: str | os.PathLike) -> bool:
  """Whether a URL's or path's file name is an archive's (`SUFFIXES`)."""
  text = os.fspath(spec)
  name = urllib.parse.urlparse(text).path if download.is_url(text) else text
  return name.lower().endswith(SUFFIXES)


def _not_archive(path: str) -> str | None:
  """`cached_path`'s check of a download: why it is no zip or tar archive, else None."""
  if zipfile.is_zipfile(path):
    return None
  try:
    if tarfile.is_tarfile(path):
      return None
  except (OSError, tarfile.TarError):
    pass
  return f"not a zip or tar archive ({files.looks_like(path)})"


def _stem(path: str) -> str:
  name = os.path.basename(path)
  for suffix in SUFFIXES:
    if name.lower().endswith(suffix):
      return name[: -len(suffix)] or "archive"
  return name


def _member_path(archive: str, name: str) -> list[str]:
  """The path parts a member `name` writes below the unpack folder (`files.name_parts`: the one check of a
  name from outside); refuses names that leave it."""
  try:
    return files.name_parts(name, f"{archive}: member")
  except files.OutsideNameError as e:
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
  """Every member of `archive` below the (existing, empty) folder `into`. Raises ArchiveError."""
  try:
    for parts, is_dir, opener in _members(archive):
      if not parts:
        continue
      dest = os.path.join(into, *parts)
      if is_dir:
        os.makedirs(dest, exist_ok=True)
        continue
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      with opener as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
  except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
    if isinstance(e, ArchiveError):
      raise
    raise ArchiveError(f"{archive}: cannot unpack it ({type(e).__name__}: {checks.one_line(e)})") from None


def unpacked(spec: str | os.PathLike, *, cache: str | None = None) -> str:
  """The folder the archive `spec` (URL or local path) is unpacked into, unpacked on first use.

  Raises DownloadError (the download) or ArchiveError (one line naming the archive and the member)."""
  text = os.fspath(spec)
  path = download.cached_path(text, cache=cache, validate=_not_archive)
  if not os.path.isfile(path):
    raise ArchiveError(f"{text}: no such archive file")
  problem = _not_archive(path)
  if problem is not None:
    raise ArchiveError(f"{text}: {problem}")
  root = download.make_dir(os.path.join(os.path.abspath(cache or cache_dir()), ARCHIVES))
  key = f"{files.sha256_file(path)[:16]}-{_stem(path)}"
  folder = os.path.join(root, key)
  if os.path.isdir(folder):
    return folder
  with open(os.path.join(root, f".{key}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.isdir(folder):  # another process unpacked it while this one waited
      return folder
    # Under the lock no other process unpacks this archive: a temporary folder is a killed one's leftover.
    for stale in glob.glob(os.path.join(glob.escape(root), f".{glob.escape(key)}.tmp-*")):
      shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root)
    try:
      _unpack(path, tmp)
      os.chmod(tmp, 0o777 & ~_umask())
      os.rename(tmp, folder)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return folder


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


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
