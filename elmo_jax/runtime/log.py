"""The one channel for what the library tells its user: whole lines on stdout, flushed, from process 0 only
unless asked. Progress bars are `elmo_jax.runtime.progress`; a CLI prints its results itself."""
from __future__ import annotations

import sys
from typing import TextIO


def _process_index() -> int:
  """This process's JAX index; 0 before JAX is imported or initialised (logging never initialises it)."""
  jax = sys.modules.get("jax")
  if jax is None:
    return 0
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    if not xla_bridge.backends_are_initialized():
      return 0
  except (ImportError, AttributeError):  # a JAX without the private probe: ask it
    pass
  return jax.process_index()


def info(message: str, *, all_processes: bool = False, stream: TextIO | None = None) -> None:
  """Writes `message` as one line (stdout unless `stream`) on process 0, or on every process."""
  if all_processes or _process_index() == 0:
    print(message, file=stream or sys.stdout, flush=True)
