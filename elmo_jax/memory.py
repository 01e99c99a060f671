"""Handing freed host memory back to the OS (glibc), so resident memory tracks what is live.

Embedding allocates and frees a device->host copy of every batch (tens of MB) from XLA's worker threads.
glibc keeps such freed blocks in its per-thread heaps, and the resident size of a long embedding job
creeps up by hundreds of MB above what it holds (measured: benchmarks/embed_throughput.py, `memory_mb`).
`malloc_trim` returns them; it costs milliseconds and is called once per pass and every few dozen batches.
Lowering glibc's mmap threshold instead keeps memory flat too but made embedding 2.5x slower (page faults).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


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
