"""The one client of a cloud bucket (gcsfs): its file system, how a URL becomes a key, and its errors as one
line (`storage` is what commands call)."""
from __future__ import annotations

import functools
import logging

SCHEME = "gs://"


class StorageError(OSError):
  """A bucket cannot be read or written (no client library, no such bucket, refused); one line."""


@functools.lru_cache(maxsize=None)
def filesystem():
  try:
    import gcsfs  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise StorageError("gs:// paths need gcsfs: pip install gcsfs google-cloud-storage "
                       "(requirements.txt has them)") from None
  # gcsfs retries a failed request 6 times with backoff, logging a traceback when it gives up; the error
  # reaches the user as one line (`call`) instead.
  logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
  # No listing cache: another process (a pod neighbour, a resumed run) may have written since.
  return gcsfs.GCSFileSystem(use_listings_cache=False, skip_instance_cache=True)


# Characters of a bucket path that a client reads as syntax, not as part of the name: refused in every path
# handed to a client (`check_url`), before anything is written.
_GLOB = "gcsfs reads a glob pattern (a move or delete would take other objects)"
_SPECIAL = {"#": "tensorstore (Orbax's checkpoints) ends the path there, so the arrays would go elsewhere",
            "?": "tensorstore reads a query from there, and gcsfs a glob pattern", "*": _GLOB, "[": _GLOB, "]": _GLOB}


def check_url(url: str, what: str = "") -> None:
  """Raises StorageError (one line naming `what` and the character) for a bucket URL that a client would not
  take as a plain name: a `_SPECIAL` character, a control character (GCS refuses CR and LF) or bytes that are
  not UTF-8. Percent signs, spaces and other characters are names to every client, and pass."""
  name = f"{what}={url}" if what else url
  for ch in url:
    if ch in _SPECIAL:
      raise StorageError(f"{name}: {ch!r} in a bucket path: {_SPECIAL[ch]}; use a name without "
                         f"{' '.join(sorted(_SPECIAL))}")
    if ord(ch) < 32 or ord(ch) == 127:
      raise StorageError(f"{name}: a control character ({ch!r}) in a bucket path; use another name")
  try:
    url.encode("utf-8")
  except UnicodeEncodeError:
    raise StorageError(f"{name.encode('utf-8', 'backslashreplace').decode()}: a bucket path must be UTF-8 "
                       "(an object name is UTF-8); use another name") from None


def key(url: str) -> str:
  check_url(url)  # every path a client is given
  return url[len(SCHEME):].rstrip("/")


def call(what: str, fn, *args, **kwargs):
  """fn(*args) with a bucket's errors as one-line StorageErrors naming `what`."""
  try:
    return fn(*args, **kwargs)
  except FileNotFoundError:
    raise
  except StorageError:
    raise
  except Exception as e:  # noqa: BLE001 - gcsfs/aiohttp/google-auth raise many types
    text = " ".join(str(e).split())[:200]
    raise StorageError(f"{what}: {type(e).__name__}: {text}") from None


