"""Local copies of remote files: `cached_path(url)` downloads once into a cache and verifies on every use.

    path = cached_path("https://.../weights.hdf5")     # http(s):// -> a verified file in the cache
    path = cached_path("file:///data/weights.hdf5")    # file:// -> that local path (nothing copied)
    path = cached_path("weights.hdf5")                  # a local path is returned as is

The cache is `$ELMO_JAX_CACHE` (default `~/.cache/elmo_jax`); each URL maps to one file there, named by
a hash of the URL plus the URL's file name. A download streams into a `.part` file beside it and is renamed
into place only when it is whole and of the right kind: every byte of the server's Content-Length arrived
(a connection cut mid-way is one line saying to run again), a published sha256 matches, and `check_kind`
(`elmo_jax.formats.checks`) passes: the caller says what the file must be (`kind=`: "hdf5" a readable HDF5
file, "json" a JSON object, "options" a valid ELMo options.json; `validate=` a further check), else the
URL's name decides (a `.hdf5`/`.h5` name must be a readable HDF5 file, a `.json` name a JSON object, other
names: no check).
This catches half a file sent without a Content-Length, an HTML error page, or a server's 200 reply
`{"error": "rate limited"}` in place of options. A caller's `verify=` runs on a fresh download only, after
those, before it is cached (a check that reads the whole file: `archive.verify` reads an archive to its
end). A failed download leaves nothing in the cache, so the next run fetches again.

`manifest.json` in the cache records each file's URL, size and sha256. What is trusted:

  * a `sha256` given by the caller (a published hash): the cached file must match it;
  * otherwise the hash recorded when the file was downloaded (after it passed `check_kind`): every later
    use is checked against it (trust on first use);
  * a file put in the cache by hand (the offline route) while the manifest is intact and has no entry for
    its URL: adopted if it passes `check_kind`, and its hash is recorded from then on.

Every use also runs `check_kind` (and `validate`). A cached file that fails its hash or its kind check is
moved aside (`*.corrupt-<time>`) and fetched again (offline: one line naming both files). An unreadable
`manifest.json` is moved aside too (one warning line) and the files then in the cache lose their trust:
each is used only if it matches a published sha256, else fetched again (the old copy moved aside) or, when
that fails (offline), refused in one line naming the file to delete or to replace with a copy you
verified. A malformed manifest entry (no valid sha256) is treated the same way. A cache path that is a
file is one line (`ELMO_JAX_CACHE=... is a file, not a directory`).
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterator

from elmo_jax.formats import checks
from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded
from elmo_jax.runtime import log
from elmo_jax.runtime.cache import cache_dir, cache_label
from elmo_jax.runtime.progress import progress

_CHUNK = 1 << 20
MANIFEST = "manifest.json"
# Manifest key (never a URL): cache file name -> [inode, bytes, mtime_ns] of the files that were in the cache
# when an unreadable manifest was set aside. A file replaced since (another stamp) is no longer on the list.
_UNTRUSTED = "#untrusted"
_CACHE_NAME = re.compile(r"[0-9a-f]{16}-.+")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class DownloadError(OSError):
  """A file that cannot be fetched or fails verification; the message is one actionable line."""


def make_dir(path: str | os.PathLike, what: str | None = None) -> str:
  """Creates the folder `path` (and its parents) if needed; a file in the way is one line naming `what`
  (default `cache_label(path)`). Raises DownloadError."""
  path = os.fspath(path)
  try:
    os.makedirs(path, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    what = what or cache_label(path)
    blocker = os.path.abspath(path)
    while blocker != os.path.dirname(blocker) and not os.path.lexists(blocker):
      blocker = os.path.dirname(blocker)
    if os.path.abspath(path) == blocker:
      raise DownloadError(f"{what} is a file, not a directory") from None
    raise DownloadError(f"{what}: {blocker} is a file, not a directory") from None
  return path


def is_url(path: str | os.PathLike) -> bool:
  return urllib.parse.urlparse(os.fspath(path)).scheme in ("http", "https", "file")


def cache_file(url: str, cache: str | None = None) -> str:
  """Where `url` lives in the cache: `<sha256(url)[:16]>-<file name of the URL>`."""
  name = os.path.basename(urllib.parse.urlparse(url).path) or "download"
  return os.path.join(cache or cache_dir(), f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}")


def _aside_path(path: str) -> str:
  aside = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
  k = 1
  while os.path.lexists(aside if k == 1 else f"{aside}.{k}"):
    k += 1
  return aside if k == 1 else f"{aside}.{k}"


def _move_aside(path: str, why: str, then: str = "fetching it again") -> str:
  aside = _aside_path(path)
  os.replace(path, aside)
  log.info(f"warning: {path}: {why}; moved to {aside}, {then}", stream=sys.stderr)
  return aside


def _stamp(path: str) -> list[int]:
  st = os.stat(path)
  return [st.st_ino, st.st_size, st.st_mtime_ns]


def _read_manifest(path: str) -> tuple[dict[str, Any], str | None]:
  """(manifest, None), ({}, None) when there is none, or ({}, why it cannot be trusted)."""
  try:
    manifest = json_bounded.load(path)
  except FileNotFoundError:
    return {}, None
  except (OSError, ValueError) as e:
    return {}, f"unreadable ({checks.one_line(e)})"
  if not isinstance(manifest, dict):
    return {}, f"not a JSON object (a JSON {type(manifest).__name__})"
  if not isinstance(manifest.get(_UNTRUSTED, {}), dict):
    return {}, f"its {_UNTRUSTED!r} list is malformed"
  return manifest, None


@contextlib.contextmanager
def _locked_manifest(cache: str) -> Iterator[dict[str, Any]]:
  """The manifest, read and written under an exclusive lock (several processes may share a cache).

  An unreadable one is copied aside (`manifest.json.corrupt-<time>`, one warning line) and replaced at once
  by one that lists every file then in the cache as untrusted (so a crash cannot make them look placed by
  hand)."""
  make_dir(cache)
  with open(os.path.join(cache, MANIFEST + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    path = os.path.join(cache, MANIFEST)
    manifest, problem = _read_manifest(path)
    if problem is not None:
      aside = _aside_path(path)
      if os.path.isfile(path):
        shutil.copyfile(path, aside)
      else:
        os.replace(path, aside)
      names = sorted(n for n in os.listdir(cache) if _CACHE_NAME.fullmatch(n) and not n.endswith(".part")
                     and ".corrupt-" not in n and os.path.isfile(os.path.join(cache, n)))
      manifest = {_UNTRUSTED: {n: _stamp(os.path.join(cache, n)) for n in names}}
      files.write_json(path, manifest)
      log.info(f"warning: {path}: {problem}; moved to {aside}; the {len(names)} file(s) in the cache are no "
               "longer trusted: each is fetched again on its next use (or refused offline)", stream=sys.stderr)
    before = json.dumps(manifest, sort_keys=True)
    yield manifest
    if json.dumps(manifest, sort_keys=True) != before:
      files.write_json(path, manifest)


def _download(url: str, target: str, timeout: float, sha256: str | None,
              replacing: str | None = None, check: Callable[[str], str | None] | None = None) -> tuple[str, int]:
  """Streams `url` into `target` (a temp file renamed into place once complete, passing `check(path)`
  (default: `check_kind` by the name) and matching `sha256` if given); returns (sha256, bytes). An existing
  `target` is moved aside just before the rename, with the warning `replacing` (why it is replaced).
  Raises DownloadError."""
  digest = hashlib.sha256()
  size = 0  # bytes received so far
  try:
    response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 - http(s) only, checked by caller
  except urllib.error.HTTPError as e:
    if 300 <= e.code < 400:  # urllib's text for this spans 3 lines
      where = e.headers.get("Location") if e.headers is not None else None
      raise DownloadError(f"{url}: too many redirects, or a redirect loop (the last: HTTP {e.code}"
                          f"{' to ' + checks.one_line(where, 120) if where else ''}); check the URL") from None
    raise DownloadError(f"{url}: HTTP {e.code} {checks.one_line(e.reason)} (check the URL)") from None
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    reason = checks.one_line(getattr(e, "reason", None) or repr(e))
    raise DownloadError(f"{url}: cannot download ({reason}); offline? fetch it by hand and put it at "
                        f"{target} (or pass its local path instead of the URL)") from None
  # Under the manifest lock no other download of this file runs: any `.part` is a killed one's leftover.
  for stale in glob.glob(glob.escape(target) + ".*.part"):
    os.remove(stale)
  with response, files.atomic_path(target, suffix=".part") as tmp:
    length = response.headers.get("Content-Length")
    total = int(length) if length and length.isdigit() else None
    bar = progress(desc=f"downloading {os.path.basename(target)}", total=total, unit="B")
    try:
      with open(tmp, "wb") as out:
        while True:
          try:
            block = response.read(_CHUNK)
          except (OSError, http.client.HTTPException) as e:  # IncompleteRead: a chunked reply cut mid-way
            if isinstance(e, http.client.IncompleteRead):
              got = size + len(e.partial or b"")
              why = "the connection closed mid-reply"
            else:
              got = size
              why = checks.one_line(repr(e))
            raise DownloadError(f"{url}: download interrupted after {got} bytes ({why}); run again to retry"
                                ) from None
          if not block:
            break
          out.write(block)
          digest.update(block)
          size += len(block)
          bar.update(len(block))
    finally:
      bar.close()
    if total is not None and size != total:
      raise DownloadError(f"{url}: download incomplete ({size} of {total} bytes); run again to retry")
    problem = check(tmp) if check is not None else checks.check_kind(tmp, name=target)
    if problem is not None:
      unsized = "" if total is not None else " (the server sent no Content-Length, so a cut was not seen)"
      raise DownloadError(f"{url}: the downloaded {size} bytes are {problem}{unsized}; not cached, run again "
                          "to retry")
    if sha256 is not None and digest.hexdigest() != sha256:
      raise DownloadError(f"{url}: downloaded file fails its published sha256 (got {digest.hexdigest()}); the "
                          "server's copy differs from the one this table knows")
    if replacing is not None and os.path.lexists(target):
      _move_aside(target, replacing, then="fetched it again")
  return digest.hexdigest(), size


def _record(manifest: dict[str, Any], url: str, target: str, sha256: str, n: int, source: str) -> None:
  manifest.get(_UNTRUSTED, {}).pop(os.path.basename(target), None)
  if _UNTRUSTED in manifest and not manifest[_UNTRUSTED]:
    del manifest[_UNTRUSTED]
  manifest[url] = {"file": os.path.basename(target), "sha256": sha256, "bytes": n,
                   "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": source}


def local_path(url_or_path: str | os.PathLike, cache: str | None = None) -> str:
  """The local file `cached_path` reads for this, without fetching anything: a `file://` URL's path, an
  `http(s)://` URL's place in the cache, or the (user-expanded) path itself."""
  text = os.fspath(url_or_path)
  parsed = urllib.parse.urlparse(text)
  if parsed.scheme == "file":
    return urllib.request.url2pathname(parsed.path)
  if parsed.scheme in ("http", "https"):
    return cache_file(text, os.path.abspath(cache or cache_dir()))
  return os.path.expanduser(text)


def cached_path(url_or_path: str | os.PathLike, sha256: str | None = None, *, cache: str | None = None,
                timeout: float = 60.0, kind: str | None = None,
                validate: Callable[[str], str | None] | None = None,
                verify: Callable[[str], str | None] | None = None) -> str:
  """A local, verified path for a local path, `file://` URL or `http(s)://` URL (downloaded once).

  What is trusted is in the module docstring: a published `sha256`, else the hash recorded when the file
  was downloaded (or first found placed by hand, with an intact manifest); `check_kind` (and `validate`)
  on every use, the fresh download included.

  Args:
    url_or_path: what to fetch.
    sha256: the file's published hash, if there is one; else the first download's hash is recorded
      in the manifest and checked on every later use.
    cache: cache directory (default `cache_dir()`).
    timeout: seconds to wait for the server.
    kind: what the file must be ("hdf5", "json", "options": see `checks.check_kind`); None infers it from the
      URL's file name (none for a name without a known extension). Callers that know should say.
    validate: a further check, `validate(path)` -> why it is wrong, or None (a ValueError/OSError it
      raises counts as its message).
    verify: a check of a fresh download only, after `validate`, before it is cached (one that reads the
      whole file, e.g. an archive to its end: a later use trusts the recorded hash of what it verified).
  Raises:
    DownloadError: offline with no trusted cached copy, HTTP error, short or cut download, a download of
      the wrong kind (`check_kind`, `validate`) or a hash mismatch.
  """
  text = os.fspath(url_or_path)
  if urllib.parse.urlparse(text).scheme not in ("http", "https"):
    return local_path(text)
  checks.require_kind(kind)
  cache = os.path.abspath(cache or cache_dir())
  target = cache_file(text, cache)
  check = lambda path: checks.check(path, target, kind, validate)  # noqa: E731
  # A fresh download also passes `verify` (once: later uses check the hash recorded of what it verified).
  fresh = check if verify is None else lambda path: (  # noqa: E731
      check(path) or checks.check(path, target, None, verify))
  with _locked_manifest(cache) as manifest:
    _forget_gone(manifest, cache)
    bad = None  # (why the cached copy failed, where it was moved): named if fetching it again fails
    if os.path.isfile(target):
      trusted, bad = _use_cached(manifest, text, target, sha256, timeout, check, fresh)
      if trusted:
        return target
    try:
      got, n = _download(text, target, timeout, sha256, check=fresh)
    except DownloadError as e:
      if bad is None:
        raise
      raise DownloadError(f"{target}: cached copy of {text} failed its check ({bad[0]}); moved to "
                          f"{bad[1]} (delete it); "
                          f"fetching it again failed ({str(e).removeprefix(text + ': ')})") from None
    _record(manifest, text, target, got, n, "published" if sha256 else "first download")
  return target


def _forget_gone(manifest: dict[str, Any], cache: str) -> None:
  """Drops the untrusted-list entries of files no longer in the cache (and the list, once empty)."""
  untrusted = manifest.get(_UNTRUSTED, {})
  for gone in [n for n in untrusted if not os.path.isfile(os.path.join(cache, n))]:
    del untrusted[gone]
  if _UNTRUSTED in manifest and not untrusted:
    del manifest[_UNTRUSTED]


def _recorded(manifest: dict[str, Any], url: str) -> str | None:
  """The sha256 the manifest recorded for `url`, None when there is none or it is malformed."""
  entry = manifest.get(url)
  recorded = entry.get("sha256") if isinstance(entry, dict) else None
  return recorded if isinstance(recorded, str) and _SHA256.fullmatch(recorded) else None


def _use_cached(manifest: dict[str, Any], url: str, target: str, sha256: str | None, timeout: float,
                check: Callable[[str], str | None], fresh: Callable[[str], str | None]
                ) -> tuple[bool, tuple[str, str] | None]:
  """Whether the cached `target` (now) holds a trusted copy of `url`, and if not, (why it failed, where it
  was moved); a once-trusted copy that lost its hash is fetched again here. Raises DownloadError."""
  recorded = _recorded(manifest, url)
  want = sha256 or recorded
  if want is not None:
    got = files.sha256_file(target)
    problem = (check(target) if got == want else
               f"sha256 {got[:12]}... differs from the {'published' if sha256 else 'recorded'} {want[:12]}...")
    if problem is None:
      if recorded != got:  # a published hash vouches for it
        _record(manifest, url, target, got, os.path.getsize(target), "published")
      return True, None
    return False, (problem, _move_aside(target, problem))
  untrusted, name = manifest.get(_UNTRUSTED, {}), os.path.basename(target)
  lost = ("cache manifest.json was unreadable, so its recorded hash is lost" if name in untrusted
          and untrusted[name] == _stamp(target) else None)
  if manifest.get(url) is not None:
    lost = "its manifest.json entry has no valid sha256"
  if lost is not None:  # once trusted, now unverifiable: fetched again before the old copy goes aside
    _refetch(manifest, url, target, timeout, lost, fresh)
    return True, None
  # Placed by hand (an intact manifest, no entry): its kind decides; recorded from now on.
  untrusted.pop(name, None)
  problem = check(target)
  if problem is None:
    _record(manifest, url, target, files.sha256_file(target), os.path.getsize(target), "found in cache")
    return True, None
  return False, (problem, _move_aside(target, problem))


def _refetch(manifest: dict[str, Any], url: str, target: str, timeout: float, lost: str,
             check: Callable[[str], str | None]) -> None:
  """Downloads `url` again over a cached copy that lost its trust (`lost`: why). Raises DownloadError."""
  try:
    got, n = _download(url, target, timeout, None, replacing=f"not trusted ({lost})", check=check)
  except DownloadError as e:
    raise DownloadError(f"{target}: cached copy of {url} not trusted ({lost}); fetching it again "
                        f"failed ({str(e).removeprefix(url + ': ')}); delete it and run again online, "
                        "or replace it with a copy you verified") from None
  _record(manifest, url, target, got, n, "first download")
