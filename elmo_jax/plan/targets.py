"""Compile targets of the planner: abstract devices of a TPU slice or a GPU cluster, and each chip's peak numbers.

A target is `<chip>:<topology>`: `v5e:16x16`, `v6e:8x8`, `v4:4x4x4`, `v5p:4x4x8` (TPU slices, chips per
axis), `h200:1x1x8`, `h100:1x2x8` (GPUs: partitions x hosts x GPUs per host), `cpu:8` (this machine's CPU
devices; set `XLA_FLAGS=--xla_force_host_platform_device_count=8`). TPU and GPU targets need no hardware:
`jax.experimental.topologies` gives abstract devices that XLA's real TPU (libtpu) and GPU (CUDA plugin)
compilers compile for.

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
    InfiniBand NIC per GPU = 50 GB/s). Memory size from the target config (specs/h100_sxm.txtpb).
  * H200: https://www.nvidia.com/en-us/data-center/h200/ (989 TFLOP/s bf16 dense, 4.8 TB/s, 141 GB; NVLink
    and NICs as H100). Memory size from specs/h200.txtpb.
  * cpu: nominal numbers (100 GFLOP/s, 20 GB/s per device); a cpu target is for checking the step's
    structure (collectives, FITS, FLOPs), not its speed.
GPU kernels: each launch is charged `LAUNCH_US` microseconds (launch + gap of a small kernel without CUDA
graphs); the planner reports launches per step so that a different cost is easy to apply.
"""
from __future__ import annotations

import dataclasses
import os
import re

GiB = 2**30
LAUNCH_US = 5.0

_SPECS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "specs")
PIP = {"tpu": 'pip install -e ".[plan-tpu]" (libtpu, the TPU compiler; no TPU needed), or run bash scripts/plan.sh',
       "cuda": 'pip install -e ".[plan-gpu]" (the CUDA plugin and ptxas; no GPU needed), or run bash scripts/plan.sh'}


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  platform: str  # "tpu", "cuda" or "cpu"
  peak_flops: float  # bf16 dense matmul FLOP/s
  hbm_bytes: float
  hbm_bandwidth: float  # bytes/s
  collective_bandwidth: float  # bytes/s per chip seen by a ring collective inside a slice / host
  cross_host_bandwidth: float | None = None  # GPUs: bytes/s per GPU between hosts
  target_config: str | None = None  # GPUs: specs/<file>.txtpb


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


class TargetError(ValueError):
  """A target the user can fix: bad spelling, a missing compiler package, too few CPU devices."""


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


_TPU_AXES = {"v4": 3, "v5p": 3, "v5e": 2, "v6e": 2}  # 3-D and 2-D tori


def parse(spec: str) -> tuple[str, str]:
  """(chip, topology) of `spec`, its shape checked before any compiler is touched: every axis a count >= 1,
  TPU v4 / v5p three axes, v5e / v6e two, GPUs three (partitions x hosts x GPUs per host), CPUs one (a device
  count). Raises TargetError."""
  m = re.fullmatch(r"(\w+):([0-9x]+)", spec.strip())
  if not m or m.group(1) not in CHIPS:
    raise TargetError(f"--target={spec!r}: expected <chip>:<topology> with chip one of {', '.join(CHIPS)}, e.g. "
                      "v5e:16x16, v4:4x4x4, h200:1x1x8, cpu:8")
  name, topo = m.groups()
  axes = topo.split("x")
  platform = CHIPS[name].platform
  if platform == "cpu" and len(axes) != 1:
    raise TargetError(f"--target={spec}: a cpu target is one device count, e.g. cpu:8")
  if platform == "cuda" and len(axes) != 3:
    raise TargetError(f"--target={spec}: GPU topologies are partitions x hosts x GPUs per host, e.g. {name}:1x1x8")
  if platform == "tpu" and len(axes) != _TPU_AXES[name]:
    example = "x".join(["4"] * _TPU_AXES[name])
    raise TargetError(f"--target={spec}: a {CHIPS[name].name} slice has {_TPU_AXES[name]} axes of chips, e.g. "
                      f"{name}:{example}")
  if not all(a.isdigit() and int(a) >= 1 for a in axes):
    raise TargetError(f"--target={spec}: every axis of the topology must be a count >= 1, e.g. "
                      + {"cpu": "cpu:8", "cuda": f"{name}:1x1x8"}.get(platform, f"{name}:4x4"))
  return name, topo


def _gpu_memory(config_text: str) -> float:
  m = re.search(r"device_memory_size:\s*(\d+)", config_text)
  return float(m.group(1)) if m else 0.0


def make_target(spec: str) -> Target:
  """Abstract devices for `spec` (see the module docstring); raises TargetError with the fix."""
  name, topo = parse(spec)
  chip = CHIPS[name]
  import jax  # pylint: disable=g-import-not-at-top
  if chip.platform == "cpu":
    n = int(topo)
    devices = jax.devices("cpu")
    if len(devices) < n:
      raise TargetError(f"--target={spec}: this process has {len(devices)} CPU device(s); run with "
                        f"XLA_FLAGS=--xla_force_host_platform_device_count={n}")
    return Target(spec, chip, devices[:n], n, float(_host_memory()))
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if chip.platform == "tpu":
    try:
      import libtpu  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise TargetError(f"--target={spec} needs the TPU compiler (libtpu): {PIP['tpu']}") from None
    desc = topologies.get_topology_desc(topology_name=f"{name}:{topo}", platform="tpu")
    devices = list(desc.devices)
    per_host = sum(1 for d in devices if d.process_index == devices[0].process_index)
    return Target(spec, chip, devices, per_host, chip.hbm_bytes)
  parts = topo.split("x")
  try:
    import jax_plugins.xla_cuda12  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise TargetError(f"--target={spec} needs the GPU compiler (the CUDA plugin): {PIP['cuda']}") from None
  with open(os.path.join(_SPECS, chip.target_config)) as f:
    config_text = f.read()
  desc = topologies.get_topology_desc(topology_name="", platform="cuda", target_config=config_text, topology=topo)
  return Target(spec, chip, list(desc.devices), int(parts[2]), _gpu_memory(config_text))


def _host_memory() -> int:
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    return 0


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
