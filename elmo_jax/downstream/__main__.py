"""`python -m elmo_jax.downstream`: see `elmo_jax.cli.downstream`."""
from elmo_jax.cli.downstream import run

if __name__ == "__main__":
  run()
