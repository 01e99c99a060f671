"""What a user sees while training: metrics.jsonl, TensorBoard event files and a progress line."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable

import jax

from elmo_jax.runtime.run_layout import METRICS_FILE, TENSORBOARD_DIR


def _import_tensorboardx():
  """tensorboardX, without the torch it imports whenever torch is installed (to accept torch tensors, which we
  never pass): 1.3-1.6 s of every train.py start on a machine that has torch. A process that already holds torch
  keeps it; tensorboardX imports torch itself, later, only for a torch tensor or image grid."""
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # `import torch` raises ImportError: tensorboardX's numpy-only path
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  finally:
    if hide:
      sys.modules.pop("torch", None)
  return tensorboardX


SummaryWriter = _import_tensorboardx().SummaryWriter


class MetricWriter:
  """Appends one JSON object per record to `workdir/metrics.jsonl` and mirrors scalars to TensorBoard.

  Only process 0 writes (`enabled=False` elsewhere). `purge_step` (a resume: the restored step + 1) makes
  TensorBoard drop the events a killed run wrote after its last checkpoint; `config` is written as text
  and as hparams (step `purge_step - 1`). After every record both are flushed and `uploaded(names)` is
  called (a bucket workdir's `Workdir.push`: whole files, so a reader of the bucket sees whole records).
  """

  def __init__(self, workdir: str, enabled: bool = True, purge_step: int | None = None,
               config: dict[str, Any] | None = None, uploaded: Callable[..., None] | None = None):
    self.enabled = enabled
    self._uploaded = uploaded
    if enabled:
      self._jsonl = open(os.path.join(workdir, METRICS_FILE), "a")
      self._tb = SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR), purge_step=purge_step)
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
    if self._uploaded is not None:
      self._tb.flush()
      self._uploaded(METRICS_FILE, TENSORBOARD_DIR)

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


class LogWindow:
  """The steps since the last log line: device metrics kept on the device until a log step or a save.

  `add` costs nothing on the host (no sync); `flush` fetches everything pending in one transfer, checks it
  is finite and folds it into `sums`. `sums` (plain floats) goes into every checkpoint, so a resumed run's
  first log line averages exactly the steps an uninterrupted run's would. tokens/s counts the wall time
  of the steps only: `pause()` before evals and saves, and the step that compiles is never timed.
  """

  KEYS = (("loss_f", "loss_forward"), ("loss_b", "loss_backward"), ("loss", "loss"), ("grad_norm", "grad_norm"))

  def __init__(self, sums: dict[str, float] | None = None):
    self.sums = dict(sums) if sums else self._zero()
    self._pending: list[tuple[int, Any]] = []
    self._timed_from: float | None = None  # wall clock of the last step boundary being timed
    self._timed_steps: set[int] = set()

  @staticmethod
  def _zero() -> dict[str, float]:
    return {"loss_f": 0.0, "loss_b": 0.0, "loss": 0.0, "grad_norm": 0.0, "n": 0, "tok": 0.0, "sec": 0.0}

  def add(self, step: int, metrics: Any) -> None:
    """Metrics of 1-based `step`, still on the device."""
    if self._timed_from is None:  # the first step after a start or pause: wait for it, time the rest
      jax.block_until_ready(metrics)
      self._timed_from = time.time()
    else:
      self._timed_steps.add(step)
    self._pending.append((step, metrics))

  def pause(self) -> None:
    """Stops the clock (before an eval or a save); the next `add` waits for its step and restarts it."""
    self.flush()
    self._timed_from = None

  def flush(self) -> None:
    """Fetches pending metrics; raises FloatingPointError naming the first step whose loss is not finite."""
    if not self._pending:
      return
    fetched = jax.device_get([m for _, m in self._pending])
    now = time.time()
    for (step, _), m in zip(self._pending, fetched):
      loss = float(m["loss"])
      if not math.isfinite(loss):
        self._pending = []
        raise FloatingPointError(
            f"non-finite loss {loss} at step {step}; stopped, and no checkpoint holds it or any later step "
            "(lower config.learning_rate or use config.grad_clip)")
    for (step, _), m in zip(self._pending, fetched):
      for key, name in self.KEYS:
        self.sums[key] += float(m[name])
      self.sums["n"] += 1
      if step in self._timed_steps:
        self.sums["tok"] += float(m["n_tokens"])
    if self._timed_from is not None and self._timed_steps:
      self.sums["sec"] += now - self._timed_from
      self._timed_from = now
    self._pending, self._timed_steps = [], set()

  def record(self, step: int) -> dict[str, Any]:
    """Flushes, returns the averages of the window and starts a new one."""
    self.flush()
    sums = self.sums
    n = max(sums["n"], 1)  # steps in the window
    record = {"step": step, "train_loss": sums["loss"] / n, "train_ppl_forward": math.exp(sums["loss_f"] / n),
              "train_ppl_backward": math.exp(sums["loss_b"] / n), "grad_norm": sums["grad_norm"] / n}
    if sums["sec"] > 0:  # a window that timed no step (all paused, e.g. behind an eval) has no rate, not 0.0
      record["tokens_per_sec"] = sums["tok"] / sums["sec"]
    self.sums = self._zero()
    return record


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
          f"{format(record['tokens_per_sec'], ',.0f') if 'tokens_per_sec' in record else '-'} tok/s{_rates(record)}  "
          f"elapsed {format_duration(elapsed)}  "
          f"ETA {format_duration(eta)}")


def _rates(record: dict[str, Any]) -> str:
  """' (52,744/device, 31.6 TFLOP/s, MFU 16.0%, HBM 2.6 GB, peak 2.9)' from the fields `training/throughput.py`
  adds (those the record has)."""
  parts = []
  if "tokens_per_sec_per_device" in record:
    parts.append(f"{record['tokens_per_sec_per_device']:,.0f}/device")
  if "tflops_per_sec_per_device" in record:
    parts.append(f"{record['tflops_per_sec_per_device']:.3g} TFLOP/s")
  if "mfu" in record:
    parts.append(f"MFU {record['mfu']:.1%}")
  if "hbm_in_use_gb" in record:
    parts.append(f"HBM {record['hbm_in_use_gb']:.1f} GB, peak {record['hbm_peak_gb']:.1f}")
  return f" ({', '.join(parts)})" if parts else ""

