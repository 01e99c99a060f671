"""Evaluates an ELMo model: `python evaluate.py --task=all --workdir=runs/default [--probe_data_dir=DIR]`, the same
command as `elmo-jax evaluate ...` (the console script; `python -m elmo_jax evaluate`). A thin wrapper around
`elmo_jax.cli.evaluate`; `python evaluate.py --help` lists its flags.
"""
from elmo_jax.cli.evaluate import config_from_flags, load_models_from_flags, main, run  # noqa: F401

if __name__ == "__main__":
  run()
