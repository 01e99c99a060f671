#!/usr/bin/env bash
# Sets up .venv if needed, then trains the default config on the embedded corpus (data/pd-small).
# Extra arguments go to train.py, e.g. --config.num_train_steps=300 or --workdir=runs/mine.
# PYTHON=python3.12 bash scripts/train.sh: on the newest jax (requirements-py312.txt in .venv-py312).
source "$(dirname "$0")/env.sh"
WORKDIR="runs/default"
for a in "$@"; do case "$a" in --workdir=*) WORKDIR="${a#--workdir=}";; esac; done
exec python train.py --workdir="$WORKDIR" --config=configs/default.py "$@"
