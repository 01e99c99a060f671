"""Command-line entry points (console scripts `elmo-jax-train`, `elmo-jax-evaluate`, `elmo-jax-embed`).
The top-level `train.py` / `evaluate.py` and `python -m elmo_jax.embed` are thin wrappers around these."""
import os
from typing import Callable

from absl import app
from absl import flags

from elmo_jax import memory


def default_config(name: str = "default") -> str:
  """`configs/NAME.py` of the working directory, else of the source tree this package sits in."""
  local = os.path.join("configs", f"{name}.py")
  if os.path.exists(local):
    return local
  tree = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", f"{name}.py")
  return tree if os.path.exists(tree) else local


def run_main(main: Callable, define_flags: Callable[[], None] | None = None) -> None:
  """Every command's start: glibc keeps freed memory for XLA's buffers (first, before JAX allocates; see
  elmo_jax/memory.py), then the command's flags where it defines them only when run, then absl."""
  memory.reuse_freed_memory()
  if define_flags is not None:
    define_flags()
  app.run(main)


def define_distributed_flags() -> None:
  """The multi-process flags of the commands that run on many hosts (train, embed)."""
  flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                    "Call jax.distributed.initialize: 'auto' when --coordinator_address is given or a cluster "
                    "(TPU pod, SLURM, Open MPI) is detected; 'on' always (JAX detects the cluster); 'off' never.")
  flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0's coordinator (multi-process runs).")
  flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
  flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
