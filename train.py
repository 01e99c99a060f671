"""Trains an ELMo biLM: `python train.py --workdir=runs/default --config=configs/default.py`.

A thin wrapper around `elmo_jax.cli.train` (also installed as the `elmo-jax-train` console script);
see `python train.py --help`.
"""
from elmo_jax.cli.train import run

if __name__ == "__main__":
  run()
