"""What an optimized HLO module says about a step on a target (`analyse_hlo`): FLOPs, HBM traffic, collectives,
loops, kernel launches and the roofline step time, the largest of compute at the chip's bf16 peak, HBM traffic at
its bandwidth, collectives at its interconnect bandwidth and (GPUs) kernel launches. The planner's report and a
run's prediction line (`training/throughput.py`) both read it."""
from __future__ import annotations

import math
from typing import Any

from elmo_jax.measure import chips as chips_lib
from elmo_jax.measure import hlo as hlo_lib


def analyse_hlo(text: str, target: chips_lib.Target, tokens_per_device: int, launch_us: float) -> dict[str, Any]:
  """The HLO-derived part of a report: FLOPs, HBM traffic, collectives, loops, launches and the roofline."""
  module = hlo_lib.Module(text)
  flops = module.flops()
  traffic = module.hbm_bytes()  # HBM only: arrays the TPU compiler placed in VMEM (`S(1)`) are on chip
  traffic_all_spaces = hlo_lib.Module(text, hbm_only=False).hbm_bytes()  # every operand, as XLA's bytes accessed
  collectives = module.collectives()
  bytes_by_kind = by_kind(collectives)
  seconds = sum(c["count"] * chips_lib.collective_seconds(target, c["op"], c["bytes"], c["group_size"])
                for c in collectives)
  largest = sorted(collectives, key=lambda c: -c["bytes"])[:5]
  chip = target.chip
  terms = {"compute_s": flops / chip.peak_flops, "hbm_s": traffic / chip.hbm_bandwidth, "collectives_s": seconds}
  loops = module.loops()
  launches = module.launches()
  if chip.platform == "cuda":
    terms["launch_s"] = launches * launch_us * 1e-6
  step_s = max(terms.values())
  return {
      "flops_per_device_per_step": flops, "flops_per_token": flops / max(tokens_per_device, 1),
      "hbm_traffic_bytes_per_step": traffic, "hbm_traffic_all_spaces_bytes_per_step": traffic_all_spaces,
      "hbm_traffic_by_kernel": module.kernel_traffic(),
      "collective_bytes_per_device": bytes_by_kind,
      "largest_collectives": [{k: c[k] for k in ("op", "dtype", "shape", "bytes", "count")} for c in largest],
      "loops": loops, "kernel_launches_per_step": launches,
      "roofline": {**terms, "step_s": step_s, "bound_by": max(terms, key=terms.get).removesuffix("_s"),
                   "tokens_per_s_per_device": tokens_per_device / step_s if step_s else math.inf,
                   "mfu_bound": terms["compute_s"] / step_s if step_s else 0.0},
  }


def by_kind(collectives: list[dict]) -> dict[str, int]:
  """{collective op: its bytes per device, summed over its instances}."""
  out: dict[str, int] = {}
  for c in collectives:
    out[c["op"]] = out.get(c["op"], 0) + c["bytes"] * c["count"]
  return out
