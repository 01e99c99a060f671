"""How well a run runs: per-device rates, TFLOP/s and MFU in its log records, the devices' memory, and what the
planner's roofline predicts for its step on these devices.

FLOPs are the analytic count (`measure.flops.train_flops_per_token`: the train step's matmul and conv FLOPs per
token position, 3 x the forward pass, at this run's rows per device), the number `elmo-jax plan`
prints; so `tflops_per_sec_per_device` is that count at the tokens/s the log window measured, and `mfu`
divides it by the chip's bf16 peak (`measure/chips.py`). A device with no peak there (a CPU, an
unlisted GPU) gets no `mfu` and no prediction, and one line at the start says so. `hbm_in_use_gb` /
`hbm_peak_gb`: `device.memory_stats()` (bytes in use now, and the most since the process started; the largest
over this process's devices), where the backend keeps them (not the CPU: then absent).

The prediction is the planner's own analysis (`measure.roofline.analyse_hlo`) of the program this run compiled
for its first step: the largest of compute at the bf16 peak, HBM traffic, collectives and (GPUs) kernel launches.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from elmo_jax.measure import chips as chips_lib
from elmo_jax.measure import flops as flops_lib
from elmo_jax.measure import roofline

# Fields of a log record that differ between identical runs, as tokens_per_sec does (the tests' TIMING_FIELDS).
FIELDS = ("tokens_per_sec_per_device", "tflops_per_sec_per_device", "mfu", "hbm_in_use_gb", "hbm_peak_gb")


def memory_fields(devices: Sequence[Any]) -> dict[str, float]:
  """{"hbm_in_use_gb", "hbm_peak_gb"}: the largest over `devices` of memory_stats(); {} where none has stats."""
  stats = [s for s in (d.memory_stats() for d in devices) if s]
  if not stats:
    return {}
  return {"hbm_in_use_gb": max(s.get("bytes_in_use", 0) for s in stats) / 1e9,
          "hbm_peak_gb": max(s.get("peak_bytes_in_use", 0) for s in stats) / 1e9}


class Throughput:
  """The run's analytic FLOPs per token and its chip; `fields(tokens_per_sec)` for every log record.

  `config` is resolved (`config.with_global_batch`: batch_size is the global batch); `chip`: a CHIPS key,
  default the one the devices are (`chips.chip_of`), None for none.
  """

  def __init__(self, config, options: dict[str, Any], vocab_size: int, devices: Sequence[Any] | None = None,
               chip: str | None = "auto"):
    self.devices = list(devices if devices is not None else jax.devices())
    self.n = len(self.devices)
    self.kind = self.devices[0].device_kind
    self.chip_name = chips_lib.chip_of(self.kind) if chip == "auto" else chip
    self.chip = chips_lib.CHIPS[self.chip_name] if self.chip_name else None
    rows = config.batch_size // self.n
    self.tokens_per_device_per_step = rows * int(config.unroll_steps)
    self.flops_per_token = flops_lib.train_flops_per_token(config, options, vocab_size, rows)["train"]
    self._local = [d for d in self.devices if d.process_index == jax.process_index()]

  def fields(self, tokens_per_sec: float | None) -> dict[str, float]:
    """The record's rates per device, its TFLOP/s, MFU (a known chip) and HBM (a backend with memory stats);
    no rates for a window that timed no step (`tokens_per_sec` None)."""
    out = {}
    if tokens_per_sec is not None:
      per_device = tokens_per_sec / self.n
      flops = per_device * self.flops_per_token
      out = {"tokens_per_sec_per_device": per_device, "tflops_per_sec_per_device": flops / 1e12}
      if self.chip is not None:
        out["mfu"] = flops / self.chip.peak_flops
    out.update(memory_fields(self._local))
    return out

  def unknown_chip_line(self) -> str | None:
    """The one line of a run on a device without a peak (why `mfu` and the prediction are absent), else None."""
    if self.chip is not None:
      return None
    return (f"no roofline prediction and no mfu for {self.n} x {self.kind}: elmo_jax/measure/chips.py has no bf16 "
            f"peak for it (analytic {self.flops_per_token / 1e9:.3g} GFLOP per token; tflops_per_sec_per_device "
            "is logged)")

  def prediction_line(self, compile_step: Callable[[], Any]) -> str | None:
    """What the planner's roofline predicts for the compiled step (`compile_step()`: the run's first step,
    compiled ahead of its call, which then finds it in jax's cache); None on a device without a peak."""
    if self.chip is None:
      return None
    target = chips_lib.Target(f"{self.chip_name}:{self.n}", self.chip, self.devices, jax.local_device_count(),
                              self.chip.hbm_bytes)
    report = roofline.analyse_hlo(compile_step().as_text(), target, self.tokens_per_device_per_step,
                                  chips_lib.LAUNCH_US)
    rf = report["roofline"]
    terms = ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.2f} ms" for k, v in rf.items()
                      if k.endswith("_s") and k != "step_s")
    return (f"roofline prediction for {self.n} x {self.chip.name} (the planner's bound for this step): "
            f"{rf['step_s'] * 1e3:.2f} ms per step, bound by {rf['bound_by']} ({terms}) -> "
            f"{rf['tokens_per_s_per_device']:,.0f} tokens/s per device, MFU bound {rf['mfu_bound']:.1%} "
            f"(analytic {self.flops_per_token / 1e9:.3g} GFLOP per token)")
