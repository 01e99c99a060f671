"""Each chip's peak numbers (`CHIPS`), which chip a jax device is (`chip_of`), and the time of a collective on
a set of devices (`Target`, `collective_seconds`): what the planner and a run's MFU both measure against.

Peak numbers (per chip; bf16 dense matmul FLOP/s, HBM bytes and bytes/s, the bandwidth a ring collective
sees per chip). Sources:
  * TPU v4:  https://cloud.google.com/tpu/docs/v4  (275 TFLOP/s, 32 GiB, 1200 GB/s; collectives: the pod's
    all-reduce bandwidth 1.1 PB/s / 4096 chips = 268 GB/s).
  * TPU v5e: https://cloud.google.com/tpu/docs/v5e (197 TFLOP/s, 16 GiB, 819 GB/s; 51.2 TB/s all-reduce
    bandwidth per 256-chip pod = 200 GB/s per chip, half the 400 GB/s bidirectional ICI).
  * TPU v5p: https://cloud.google.com/tpu/docs/v5p (459 TFLOP/s, 95 GiB, 2765 GB/s; 1200 GB/s bidirectional
    ICI per chip -> 600 GB/s).
  * TPU v6e: https://cloud.google.com/tpu/docs/v6e (918 TFLOP/s, 32 GiB, 1640 GB/s; 102.4 TB/s all-reduce
    bandwidth per 256-chip pod = 400 GB/s per chip).
  * H100 SXM: https://www.nvidia.com/en-us/data-center/h100/ (989 TFLOP/s bf16 dense (1979 with sparsity),
    3.35 TB/s; NVLink 900 GB/s bidirectional = 450 GB/s per direction; between hosts one 400 Gb/s NDR
    InfiniBand NIC per GPU = 50 GB/s). Memory size from the target config (elmo_jax/plan/specs/h100_sxm.txtpb).
  * H200: https://www.nvidia.com/en-us/data-center/h200/ (989 TFLOP/s bf16 dense, 4.8 TB/s, 141 GB; NVLink
    and NICs as H100). Memory size from elmo_jax/plan/specs/h200.txtpb.
  * cpu: nominal numbers (100 GFLOP/s, 20 GB/s per device); a cpu target is for checking the step's
    structure (collectives, FITS, FLOPs), not its speed.
GPU kernels: each launch is charged `LAUNCH_US` microseconds (launch + gap of a small kernel without CUDA
graphs); the planner reports launches per step so that a different cost is easy to apply.
"""
from __future__ import annotations

import dataclasses
import re

GiB = 2**30
LAUNCH_US = 5.0


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  platform: str  # "tpu", "cuda" or "cpu"
  peak_flops: float  # bf16 dense matmul FLOP/s
  hbm_bytes: float
  hbm_bandwidth: float  # bytes/s
  collective_bandwidth: float  # bytes/s per chip seen by a ring collective inside a slice / host
  cross_host_bandwidth: float | None = None  # GPUs: bytes/s per GPU between hosts
  target_config: str | None = None  # GPUs: elmo_jax/plan/specs/<file>.txtpb


CHIPS = {
    "v4": Chip("TPU v4", "tpu", 275e12, 32 * GiB, 1200e9, 268e9),
    "v5e": Chip("TPU v5e", "tpu", 197e12, 16 * GiB, 819e9, 200e9),
    "v5p": Chip("TPU v5p", "tpu", 459e12, 95 * GiB, 2765e9, 600e9),
    "v6e": Chip("TPU v6e", "tpu", 918e12, 32 * GiB, 1640e9, 400e9),
    "h100": Chip("H100 SXM", "cuda", 989e12, 0, 3.35e12, 450e9, 50e9, "h100_sxm.txtpb"),
    "h200": Chip("H200", "cuda", 989e12, 0, 4.8e12, 450e9, 50e9, "h200.txtpb"),
    "cpu": Chip("CPU", "cpu", 100e9, 0, 20e9, 20e9),
}


# `device.device_kind` of the chips above as jax names them (lower case; the first match wins, so "v5 lite"
# before "v5"). Variants with other peaks (H100 PCIe / NVL, H200 NVL, GH200) match none: no MFU for them.
_DEVICE_KINDS = ((r"tpu v4", "v4"), (r"tpu v5 ?(lite|e)", "v5e"), (r"tpu v5p?\b", "v5p"),
                 (r"tpu v6 ?(lite|e)", "v6e"), (r"^nvidia h200$", "h200"), (r"^nvidia h100 (80gb hbm3|sxm)", "h100"))


def chip_of(device_kind: str) -> str | None:
  """The CHIPS key of a device as jax reports it (`jax.devices()[0].device_kind`, e.g. "TPU v5 lite",
  "NVIDIA H200"); None when this table has no peak for it (a CPU, another GPU)."""
  kind = " ".join(device_kind.lower().split())
  return next((name for pattern, name in _DEVICE_KINDS if re.search(pattern, kind)), None)


@dataclasses.dataclass
class Target:
  spec: str
  chip: Chip
  devices: list
  devices_per_host: int
  hbm_bytes: float

  @property
  def n(self) -> int:
    return len(self.devices)


def collective_seconds(target: Target, op: str, nbytes: float, group: int | None) -> float:
  """Ring-algorithm time of one collective of `nbytes` per device (result bytes) over `group` devices."""
  n = group or target.n
  if n <= 1:
    return 0.0
  wire = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": (n - 1),
          "all-to-all": (n - 1) / n, "collective-permute": 1.0}[op] * nbytes
  bandwidth = target.chip.collective_bandwidth
  if target.chip.cross_host_bandwidth and n > target.devices_per_host:
    bandwidth = target.chip.cross_host_bandwidth  # the ring crosses hosts: every GPU's NIC carries its share
  return wire / bandwidth
