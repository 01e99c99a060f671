"""Evaluates an ELMo model: `python evaluate.py --task=all --workdir=runs/default [--probe_data_dir=DIR]`.

A thin wrapper around `elmo_jax.cli.evaluate` (also installed as the `elmo-jax-evaluate` console script);
see `python evaluate.py --help`.
"""
from elmo_jax.cli.evaluate import config_from_flags, load_models_from_flags, main, run  # noqa: F401

if __name__ == "__main__":
  run()
