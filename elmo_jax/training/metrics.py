"""What a user sees while training: metrics.jsonl, TensorBoard event files and a progress line."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

from tensorboardX import SummaryWriter


class MetricWriter:
  """Appends one JSON object per record to `workdir/metrics.jsonl` and mirrors scalars to TensorBoard.

  Only process 0 writes (`enabled=False` elsewhere).
  """

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if enabled:
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, record: dict[str, Any]) -> None:
    if not self.enabled:
      return
    clean = {k: (float(v) if isinstance(v, float) or hasattr(v, "item") else v) for k, v in record.items()}
    self._jsonl.write(json.dumps(clean, sort_keys=True) + "\n")
    self._jsonl.flush()
    step = int(record["step"])
    for k, v in clean.items():
      if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
        self._tb.add_scalar(k, v, step)

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def progress_line(step: int, total: int, record: dict[str, Any], started: float, first_step: int) -> str:
  elapsed = time.time() - started
  done = max(step - first_step, 1)
  eta = elapsed / done * (total - step)
  return (f"step {step}/{total}  loss {record['train_loss']:.3f}  "
          f"ppl fwd {record['train_ppl_forward']:.1f} bwd {record['train_ppl_backward']:.1f}  "
          f"{record['tokens_per_sec']:,.0f} tok/s  elapsed {format_duration(elapsed)}  ETA {format_duration(eta)}")


def say(message: str) -> None:
  print(message, flush=True, file=sys.stdout)
