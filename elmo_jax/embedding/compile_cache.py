"""JAX's persistent compilation cache for embedding processes: a second process reuses the first one's
compiles (the char CNN's per width, the gathers', the biLM's per bucket), so it starts fast."""
from __future__ import annotations

import os
import sys
import tempfile

import jax

from elmo_jax.runtime import cache
from elmo_jax.runtime import files
from elmo_jax.runtime import log
from elmo_jax.sources import download

# JAX's default for jax_persistent_cache_enable_xla_caches, which puts the cache's path into every key.
_PATH_IN_KEY = "xla_gpu_per_fusion_autotune_cache_dir"
# No entry is this large: JAX reads a read-only cache and writes nothing (one warning per program otherwise).
READ_ONLY_MIN_ENTRY = 1 << 62


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str | None:
  """Turns on JAX's persistent compilation cache, so a new process reuses earlier compiles.

  The directory is `path`, else the project's cache folder (`runtime/cache.cache_dir`: `$ELMO_JAX_CACHE`, else
  `~/.cache/elmo_jax`). A cache directory the user already configured (jax_compilation_cache_dir) is left as it
  is. Returns the directory in use. A file where the folder should be is one line (`download.DownloadError`:
  "ELMO_JAX_CACHE=... is a file, not a directory"). Keys do not hold the folder's path (a warm cache copied
  elsewhere, e.g. into a container, is used as is); a read-only folder is read and not written, said once.
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
  # JAX puts XLA's GPU autotune cache inside this folder and its path into every program's key: a warm cache
  # copied to another path (a container image's) then missed every program (30 s instead of 3). Off, a key is
  # the program's alone (the cached executable is already autotuned).
  if jax.config.jax_persistent_cache_enable_xla_caches == _PATH_IN_KEY:
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
  if not _takes_writes(path):  # a read-only cache (a mounted image's): read, never written, said once
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", READ_ONLY_MIN_ENTRY)
    log.info(f"note: the compilation cache {path} is read-only: its programs are read, new ones are not kept",
             stream=sys.stderr)
  return path


def _takes_writes(path: str) -> bool:
  """Whether a file can be made in `path` (a real probe: access() says yes to root on a read-only mount)."""
  try:
    os.rmdir(tempfile.mkdtemp(dir=path, prefix=files.WRITE_PROBE_PREFIX))
    return True
  except OSError:
    return False
