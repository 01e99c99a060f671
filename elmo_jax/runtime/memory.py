"""Host memory and glibc: freed blocks kept for reuse by XLA, and handed back to the OS when asked.

XLA:CPU allocates each execution's temporaries in large blocks. Above glibc's mmap threshold (and in the
64 MB-capped per-thread arenas) every execution maps fresh pages and takes a page fault on each 4 KiB it
touches, then unmaps them again: measured on the biLSTM train step of benchmarks/train_throughput.py
(hidden 512, projection 128, batch 64) that was ~45 of 190 ms. `reuse_freed_memory` (the command-line
entry points call it first) makes glibc serve them from one reusable heap instead.

Embedding allocates and frees a device->host copy of every batch (tens of MB) from XLA's worker threads.
glibc keeps such freed blocks in its per-thread heaps, and the resident size of a long embedding job
creeps up by hundreds of MB above what it holds (measured: benchmarks/embed_throughput.py, `memory_mb`).
`malloc_trim` returns them; it costs ~10 ms and is called every few dozen batches and after a long pass.
Lowering glibc's mmap threshold instead keeps memory flat too but made embedding 2.5x slower (page faults).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _libc():
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name) if name else None
  except OSError:
    return None
  return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc only (not musl, macOS)


def release_free_memory() -> None:
  """Returns the allocator's free pages to the OS where it can (glibc `malloc_trim(0)`); else nothing."""
  libc = _libc()
  if libc is not None:
    libc.malloc_trim(0)


# mallopt parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


def reuse_freed_memory() -> bool:
  """One heap for all threads, no mmap below 1 GiB, no automatic trimming; True if glibc took it.

  Call before JAX allocates (threads already bound to an arena keep it). Freed memory then stays in the
  process for the next step instead of being unmapped and faulted in again; `release_free_memory` still
  hands it back when called (embedding does, every few dozen batches). Off glibc: nothing, False.
  """
  libc = _libc()
  if libc is None or not hasattr(libc, "mallopt"):
    return False
  return all([libc.mallopt(_M_ARENA_MAX, 1), libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30),
              libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)])


def freeze_loaded_objects() -> int:
  """For a long-lived process once it has loaded what it keeps (a server's model): collects the garbage, then
  moves every live object out of the cyclic collector's reach (`gc.freeze`, as CPython advises for servers), so
  a full collection no longer walks them: with the `small` model loaded a full pass took ~240 ms, in whichever
  call it landed, and 13-35 ms after (2 CPU cores, one sentence a call). A cycle among them that becomes garbage
  later is never collected, so a process that loads models again and again should not call it. Returns the
  number of objects frozen."""
  gc.collect()
  gc.freeze()
  return gc.get_freeze_count()
