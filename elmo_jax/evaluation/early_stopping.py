"""Epochs with patience on a dev score, keeping the best: the loop of the probes and the task models."""
from __future__ import annotations

from typing import Callable, TypeVar

Record = TypeVar("Record")


def run_epochs(run_epoch: Callable[[int], Record], improves: Callable[[Record, Record | None], bool],
               max_epochs: int, patience: int, best: Record | None = None,
               keep: Callable[[Record], Record] = lambda record: record) -> tuple[Record | None, int]:
  """Runs epochs 1..max_epochs until `patience` epochs in a row bring no improvement.

  Args:
    run_epoch: trains epoch `epoch` (1-based) and returns its record (dev score, params, ...).
    improves: whether a record beats the best so far (`best`; None until one has); a strict comparison
      breaks ties in favour of the earlier epoch.
    max_epochs: the epoch limit.
    patience: checked after every epoch, improving or not: 0 stops after the first epoch.
    best: the record to beat at the start (None: the first epoch's wins if `improves` says so).
    keep: what is stored of an improving record (e.g. its params copied to the host).

  Returns:
    (the best record, or `best` when none improved on it; the number of epochs run).
  """
  epoch, stale = 0, 0
  for epoch in range(1, max_epochs + 1):
    record = run_epoch(epoch)
    if improves(record, best):
      best, stale = keep(record), 0
    else:
      stale += 1
    if stale >= patience:
      break
  return best, epoch
