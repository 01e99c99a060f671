"""Says where a command runs: the first line of train/embed/evaluate, and a loud warning when an
accelerator sits idle because the installed jaxlib is the CPU build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Callable

from elmo_jax.runtime import log

# Set on Cloud TPU VMs and by GKE for TPU pods (not TPU_SKIP_MDS_QUERY: importing jax sets that one).
_TPU_ENV = ("TPU_NAME", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID")
INSTALL = {"gpu": 'pip install -e ".[cuda12]"  (or: ELMO_JAX_EXTRA=cuda12 bash scripts/train.sh)',
           "tpu": 'pip install -e ".[tpu]"  (or: ELMO_JAX_EXTRA=tpu bash scripts/train.sh)'}


def machine_accelerator() -> str | None:
  """'tpu' or 'gpu' when this machine has one (TPU env vars, a working `nvidia-smi`), else None.

  Independent of JAX: this is what could be used, not what is.
  """
  if any(os.environ.get(k) for k in _TPU_ENV):
    return "tpu"
  smi = shutil.which("nvidia-smi")
  if smi:
    try:
      out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
      return None
    if out.returncode == 0 and "GPU" in out.stdout:
      return "gpu"
  return None


def describe() -> str:
  """`backend gpu: 8 x NVIDIA H100 80GB HBM3 (8 local, 1 process)`."""
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  kinds = sorted({d.device_kind for d in devices})
  return (f"backend {jax.default_backend()}: {len(devices)} x {', '.join(kinds)} "
          f"({jax.local_device_count()} local, {jax.process_count()} process"
          f"{'es' if jax.process_count() > 1 else ''})")


def announce(echo: Callable[[str], None] | None = None) -> str:
  """Prints where this process runs (process 0 only) and warns when JAX misses the machine's
  accelerator; returns the line."""
  import jax  # pylint: disable=g-import-not-at-top
  echo = echo or (lambda line: log.info(line, stream=sys.stderr))
  line = describe()
  if jax.process_index() == 0:
    echo(line)
  accel = machine_accelerator()
  if accel and jax.default_backend() == "cpu":
    bar = "!" * 78
    echo(f"{bar}\nWARNING: this machine has a {accel.upper()} but JAX runs on the CPU (the installed jaxlib "
         f"is the CPU build),\nso everything will be very slow. Install the {accel.upper()} build:\n"
         f"    {INSTALL[accel]}\n{bar}")
  return line
