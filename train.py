"""Trains an ELMo biLM: `python train.py --workdir=runs/default --config=configs/default.py`, the same command as
`elmo-jax train ...` (the console script; `python -m elmo_jax train`). A thin wrapper around `elmo_jax.cli.train`;
`python train.py --help` lists its flags.
"""
from elmo_jax.cli.train import run

if __name__ == "__main__":
  run()
