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

  Only process 0 writes (`enabled=False` elsewhere). `purge_step` (a resume: the restored step + 1) makes
  TensorBoard drop the events a killed run wrote after its last checkpoint; `config` is written as text
  and as hparams (step `purge_step - 1`).
  """

  def __init__(self, workdir: str, enabled: bool = True, purge_step: int | None = None,
               config: dict[str, Any] | None = None):
    self.enabled = enabled
    if enabled:
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge_step)
      if config is not None:
        self._write_config(config, max((purge_step or 1) - 1, 0))

  def _write_config(self, config: dict[str, Any], step: int) -> None:
    from tensorboardX.summary import hparams  # pylint: disable=g-import-not-at-top
    from elmo_jax.training.resume import flatten  # pylint: disable=g-import-not-at-top
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    self._tb.add_text("config", "\n".join("    " + line for line in text.splitlines()), step)
    flat = {k: (v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str))
            for k, v in flatten(config).items() if v is not None}
    for summary in hparams(flat, {"eval_ppl": 0.0, "train_loss": 0.0}):  # experiment, session start/end
      self._tb.file_writer.add_summary(summary)

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
