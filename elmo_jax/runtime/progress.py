"""One progress style for every long job: a tqdm bar with count, rate and ETA on stderr.

Quiet when stderr is not a terminal (batch logs stay readable) or after `set_enabled(False)` (the entry
points' `--noprogress`); `ELMO_JAX_PROGRESS=1` forces bars on, `=0` off. Library code calls `progress(...)`
and never decides this itself. A job whose log is the place to follow it (the embedding command, which may
run as many processes) prints whole lines instead (`Lines`).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterable, Iterator, Sequence, TextIO, TypeVar

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


class Lines:
  """Progress as whole lines on `stream` (default stderr), at most every `every` seconds (None: silent).

  Why not a bar (`progress`): a bar redraws one line in place and is silent when stderr is not a terminal,
  while a long job's log (a file, a pipe its launcher reads) needs plain lines whatever the terminal, and the
  counts may be polled (`poll`: e.g. the work every process of a job committed) instead of summed from this
  process's `update`s, which tqdm cannot show. So these are lines, counted here; the caller decides whether
  to print them (`every`), as `progress` decides for bars.

  `done`: the counts earlier runs finished (a resumed job), shown but not in the rates; `describe(counts,
  rates, eta)` words a line from the counts shown, this run's rates per second and the time left of the
  first count to `total` ("%H:%M:%S", "?" before any progress). A line is printed only when the first
  count moved since the last one.
  """

  def __init__(self, total: int, describe: Callable[[Sequence[int], Sequence[float], str], str],
               every: float | None = 5.0, stream: TextIO | None = None, done: Sequence[int] = (0,),
               poll: Callable[[], Sequence[int]] | None = None):
    self.total, self.describe, self.every, self.done, self.poll = total, describe, every, done, poll
    self.stream = stream if stream is not None else sys.stderr
    self.start = self._last = time.perf_counter()
    self.counts = [0] * len(done)  # this process, this run
    self._shown: int | None = None  # the first count of the last line printed

  def update(self, *counts: int) -> None:
    """Adds this process's `counts` (none: a chance to print, e.g. while waiting on `poll`'s)."""
    for i, n in enumerate(counts):
      self.counts[i] += n
    now = time.perf_counter()
    if self.every is not None and now - self._last >= self.every:
      self._last = now
      self._print(now)

  def finish(self) -> None:
    """The last line, when it says more than the last one printed."""
    if self.every is not None:
      self._print(None)

  def _print(self, now: float | None) -> None:
    counts = self.poll() if self.poll is not None else [d + c for d, c in zip(self.done, self.counts)]
    if counts[0] == self._shown:
      return
    elapsed = max((now or time.perf_counter()) - self.start, 1e-9)
    rates = [(c - d) / elapsed for c, d in zip(counts, self.done)]
    eta = (self.total - counts[0]) / rates[0] if rates[0] > 0 else float("inf")
    eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
    self.stream.write(self.describe(counts, rates, eta_text) + "\n")
    self.stream.flush()
    self._shown = counts[0]
