"""Compile targets of the planner: abstract devices of a TPU slice or a GPU cluster.

A target is `<chip>:<topology>`: `v5e:16x16`, `v6e:8x8`, `v4:4x4x4`, `v5p:4x4x8` (TPU slices, chips per
axis), `h200:1x1x8`, `h100:1x2x8` (GPUs: partitions x hosts x GPUs per host), `cpu:8` (this machine's CPU
devices; set `XLA_FLAGS=--xla_force_host_platform_device_count=8`). TPU and GPU targets need no hardware:
`jax.experimental.topologies` gives abstract devices that XLA's real TPU (libtpu) and GPU (CUDA plugin)
compilers compile for.

The chips and their peaks are `elmo_jax/measure/chips.py`.
"""
from __future__ import annotations

import os
import re

from elmo_jax.measure.chips import CHIPS, Target

_SPECS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "specs")
PIP = {"tpu": 'pip install -e ".[plan-tpu]" (libtpu, the TPU compiler; no TPU needed), or run bash scripts/plan.sh',
       "cuda": 'pip install -e ".[plan-gpu]" (the CUDA plugin and ptxas; no GPU needed), or run bash scripts/plan.sh'}


class TargetError(ValueError):
  """A target the user can fix: bad spelling, a missing compiler package, too few CPU devices."""


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
