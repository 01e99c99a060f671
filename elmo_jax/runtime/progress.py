"""One progress style for every long job: a tqdm bar with count, rate and ETA on stderr.

Quiet when stderr is not a terminal (batch logs stay readable) or after `set_enabled(False)` (the entry
points' `--noprogress`); `ELMO_JAX_PROGRESS=1` forces bars on, `=0` off. Library code calls `progress(...)`
and never decides this itself.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")
_enabled: bool | None = None   # None: decide from the environment and the terminal


def set_enabled(flag: bool | None) -> None:
  """Turns bars on/off for this process; None restores the default (terminal detection)."""
  global _enabled
  _enabled = flag


def enabled() -> bool:
  if _enabled is not None:
    return _enabled
  forced = os.environ.get("ELMO_JAX_PROGRESS", "")
  if forced in ("0", "1"):
    return forced == "1"
  return sys.stderr.isatty()


def progress(iterable: Iterable[T] | None = None, *, desc: str, total: float | None = None,
             unit: str = "it", disable: bool = False, **kwargs) -> tqdm:
  """A tqdm bar in the project's style; `disable=True` (e.g. on processes other than 0) silences it.

  Use as an iterable wrapper (`for x in progress(xs, desc="embedding")`) or manually
  (`bar = progress(desc="tokens", total=n, unit="tok"); bar.update(k); bar.close()`).
  """
  return tqdm(iterable, desc=desc, total=total, unit=unit, disable=disable or not enabled(),
              file=sys.stderr, dynamic_ncols=True, mininterval=0.5, unit_scale=unit not in ("it", "batch"), **kwargs)


def track(iterable: Iterable[T], *, desc: str, total: float | None = None, count=None, unit: str = "it",
          disable: bool = False) -> Iterator[T]:
  """Yields from `iterable` under a bar; after each item the bar moves to `count()` when given (e.g. the
  sentences a batch iterator has read so far), else by one. The bar closes when the loop ends or stops."""
  bar = progress(desc=desc, total=total, unit=unit, disable=disable)
  try:
    for item in iterable:  # counted when fetched: a consumer that stops after N items still shows N
      bar.update((count() - bar.n) if count is not None else 1)
      yield item
  finally:
    bar.close()
