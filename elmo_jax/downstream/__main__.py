"""`python -m elmo_jax.downstream`: see `elmo_jax.downstream.cli`."""
from elmo_jax.downstream.cli import run

if __name__ == "__main__":
  run()
