"""Local copies of remote files: `cached_path(url)` downloads once into a cache and verifies on every use.

    path = cached_path("https://.../weights.hdf5")     # http(s):// -> a verified file in the cache
    path = cached_path("file:///data/weights.hdf5")    # file:// -> that local path (nothing copied)
    path = cached_path("weights.hdf5")                  # a local path is returned as is

The cache is `$ELMO_JAX_CACHE` (default `~/.cache/elmo_jax`); each URL maps to one file there, named by
a hash of the URL plus the URL's file name. A download streams into a temp file beside it and is renamed
only once all bytes (the server's Content-Length) arrived and the sha256 matched, so an interrupted
download never leaves a file that looks complete. `manifest.json` in the cache records each file's URL,
size and sha256: a `sha256` given by the caller (a published hash) is checked; otherwise the hash seen on
the first download is recorded and every later use is checked against it (trust on first use). A cached
file that fails its check is moved aside (`*.corrupt-<time>`) and fetched again.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

from elmo_jax import files
from elmo_jax import log
from elmo_jax.progress import progress

_CHUNK = 1 << 20
MANIFEST = "manifest.json"


class DownloadError(OSError):
  """A file that cannot be fetched or fails verification; the message is one actionable line."""


def cache_dir() -> str:
  """`$ELMO_JAX_CACHE`, else `~/.cache/elmo_jax` (not created here)."""
  return os.path.abspath(os.path.expanduser(os.environ.get("ELMO_JAX_CACHE") or "~/.cache/elmo_jax"))


def is_url(path: str | os.PathLike) -> bool:
  return urllib.parse.urlparse(os.fspath(path)).scheme in ("http", "https", "file")


def cache_file(url: str, cache: str | None = None) -> str:
  """Where `url` lives in the cache: `<sha256(url)[:16]>-<file name of the URL>`."""
  name = os.path.basename(urllib.parse.urlparse(url).path) or "download"
  return os.path.join(cache or cache_dir(), f"{hashlib.sha256(url.encode()).hexdigest()[:16]}-{name}")


@contextlib.contextmanager
def _locked_manifest(cache: str) -> Iterator[dict[str, Any]]:
  """The manifest, read and written under an exclusive lock (several processes may share a cache)."""
  os.makedirs(cache, exist_ok=True)
  with open(os.path.join(cache, MANIFEST + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    path = os.path.join(cache, MANIFEST)
    try:
      with open(path) as f:
        manifest = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
      manifest = {}
    before = json.dumps(manifest, sort_keys=True)
    yield manifest
    if json.dumps(manifest, sort_keys=True) != before:
      files.write_json(path, manifest)


def _move_aside(path: str, why: str) -> str:
  aside = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
  os.replace(path, aside)
  log.info(f"warning: {path}: {why}; moved to {aside}, fetching it again", stream=sys.stderr)
  return aside


def _download(url: str, target: str, timeout: float, sha256: str | None) -> tuple[str, int]:
  """Streams `url` into `target` (temp + rename once complete and matching `sha256` if given); returns
  (sha256, bytes). Raises DownloadError."""
  h, n = hashlib.sha256(), 0
  try:
    response = urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 - http(s) only, checked by caller
  except urllib.error.HTTPError as e:
    raise DownloadError(f"{url}: HTTP {e.code} {e.reason} (check the URL)") from None
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, "reason", e)
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
          except OSError as e:
            raise DownloadError(f"{url}: download interrupted after {n} bytes ({e}); run again to retry"
                                ) from None
          if not block:
            break
          out.write(block)
          h.update(block)
          n += len(block)
          bar.update(len(block))
    finally:
      bar.close()
    if total is not None and n != total:
      raise DownloadError(f"{url}: download incomplete ({n} of {total} bytes); run again to retry")
    if sha256 is not None and h.hexdigest() != sha256:
      raise DownloadError(f"{url}: downloaded file fails its published sha256 (got {h.hexdigest()}); the "
                          "server's copy differs from the one this table knows")
  return h.hexdigest(), n


def cached_path(url_or_path: str | os.PathLike, sha256: str | None = None, *, cache: str | None = None,
                timeout: float = 60.0) -> str:
  """A local, verified path for a local path, `file://` URL or `http(s)://` URL (downloaded once).

  Args:
    url_or_path: what to fetch.
    sha256: the file's published hash, if there is one; else the first download's hash is recorded
      in the manifest and checked on every later use.
    cache: cache directory (default `cache_dir()`).
    timeout: seconds to wait for the server.
  Raises:
    DownloadError: offline with no cached copy, HTTP error, short download or a hash mismatch.
  """
  text = os.fspath(url_or_path)
  parsed = urllib.parse.urlparse(text)
  if parsed.scheme == "file":
    return urllib.request.url2pathname(parsed.path)
  if parsed.scheme not in ("http", "https"):
    return os.path.expanduser(text)
  cache = os.path.abspath(cache or cache_dir())
  target = cache_file(text, cache)
  with _locked_manifest(cache) as manifest:
    entry = manifest.get(text)
    if os.path.exists(target):
      want = sha256 or (entry or {}).get("sha256")
      got = files.sha256_file(target)
      if want is None:  # placed by hand: trust it now, check it from here on
        manifest[text] = {"file": os.path.basename(target), "sha256": got, "bytes": os.path.getsize(target),
                          "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": "found in cache"}
        return target
      if got == want:
        return target
      _move_aside(target, f"sha256 {got[:12]}... differs from the expected {want[:12]}...")
    got, n = _download(text, target, timeout, sha256)
    manifest[text] = {"file": os.path.basename(target), "sha256": got, "bytes": n,
                      "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "source": "published" if sha256 else "first download"}
  return target

