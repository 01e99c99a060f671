"""The project's cache folder: `$ELMO_JAX_CACHE`, else `~/.cache/elmo_jax`.

Downloads (`sources/download`), unpacked model archives (`ARCHIVES`, `sources/archive`), bucket copies
(`runtime/storage`), prepared-corpus verification stamps (`data/manifest`) and the compilation cache live
under it; this module only names it, so `runtime` needs nothing above it to find it.
"""
from __future__ import annotations

import os

DEFAULT = "~/.cache/elmo_jax"
ARCHIVES = "archives"  # CACHE/archives/<sha256[:16]>-<name>/: one unpacked archive each


def cache_dir() -> str:
  """`$ELMO_JAX_CACHE`, else `~/.cache/elmo_jax` (not created here: `download.make_dir`)."""
  return os.path.abspath(os.path.expanduser(os.environ.get("ELMO_JAX_CACHE") or DEFAULT))


def cache_label(path: str | os.PathLike) -> str:
  """How a message names the cache folder `path`: `ELMO_JAX_CACHE=VALUE` when that is where it comes from."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  env = os.environ.get("ELMO_JAX_CACHE")
  if env and os.path.abspath(os.path.expanduser(env)) == path:
    return f"ELMO_JAX_CACHE={env}"
  if path == os.path.abspath(os.path.expanduser(DEFAULT)):
    return f"the cache folder {path} (set ELMO_JAX_CACHE to use another)"
  return f"the cache folder {path}"
