"""JAX's persistent compilation cache for embedding processes: a second process reuses the first one's
compiles (the char CNN's per width, the gathers', the biLM's per bucket), so it starts fast."""
from __future__ import annotations

import os

import jax

from elmo_jax.interop import download
from elmo_jax.runtime import cache


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
  """Turns on JAX's persistent compilation cache, so a new process reuses earlier compiles.

  The directory is `path`, else the project's cache folder (`runtime/cache.cache_dir`: `$ELMO_JAX_CACHE`, else
  `~/.cache/elmo_jax`). A cache directory the user already configured (jax_compilation_cache_dir) is left as it
  is. Returns the directory in use. A file where the folder should be is one line (`download.DownloadError`:
  "ELMO_JAX_CACHE=... is a file, not a directory").
  """
  current = jax.config.jax_compilation_cache_dir
  if current and path is None:
    return current
  given = path is not None
  path = os.fspath(path) if given else cache.cache_dir()
  # a file in the way: one line naming it (ELMO_JAX_CACHE=... when that is where it comes from)
  download.make_dir(path, f"the compilation cache folder {path}" if given else None)
  jax.config.update("jax_compilation_cache_dir", path)
  # The default (1 s) skips the char CNN's, the gathers' and the small eager ops' compiles, which add up.
  if jax.config.jax_persistent_cache_min_compile_time_secs >= 1.0:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  return path
