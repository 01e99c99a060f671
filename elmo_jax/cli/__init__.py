"""Command-line entry points (console scripts `elmo-jax-train`, `elmo-jax-evaluate`, `elmo-jax-embed`).
The top-level `train.py` / `evaluate.py` and `python -m elmo_jax.embed` are thin wrappers around these."""
import os
from typing import Callable

from absl import app

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
