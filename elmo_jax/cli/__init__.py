"""Command-line entry points (console scripts `elmo-jax-train`, `elmo-jax-evaluate`, `elmo-jax-embed`).
The top-level `train.py` / `evaluate.py` and `python -m elmo_jax.embed` are thin wrappers around these."""
import os


def default_config(name: str = "default") -> str:
  """`configs/NAME.py` of the working directory, else of the source tree this package sits in."""
  local = os.path.join("configs", f"{name}.py")
  if os.path.exists(local):
    return local
  tree = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", f"{name}.py")
  return tree if os.path.exists(tree) else local
