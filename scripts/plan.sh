#!/usr/bin/env bash
# The AOT planner with XLA's TPU and GPU compilers (no accelerator needed): sets up .venv-plan on first use
# (requirements.txt + libtpu + the CUDA plugin and ptxas of the pinned jax, ~2.5 GB in all; kept apart from .venv,
# where an installed libtpu would make CPU training probe for a TPU), then runs `python -m elmo_jax plan`:
# PYTHON=python3.12: the newest jax's compilers (requirements-py312.txt) in .venv-plan-py312.
#   bash scripts/plan.sh --config=configs/lm1b.py --target=v5e:8x8 --per_device_batch=256
#   bash scripts/plan.sh --config=configs/lm1b.py --target=v5e:16x16   # the config's per_device_batch_size (128)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/python.sh
if ! PY="$(elmo_python "${PYTHON:-python3}")" || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "[elmo_jax] needs Python >= 3.11; ${PYTHON:-python3} is $("${PYTHON:-python3}" --version 2>&1 | head -1). Set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
elmo_lock "$PY"
VENV="${VENV/.venv/.venv-plan}"
[ -x "$VENV/bin/python" ] || { echo "[elmo_jax] creating $VENV" >&2; "$PY" -m venv "$VENV"; }
STAMP="$VENV/.requirements.sha256"
WANT="$(cat "$LOCK" pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  JAX_VERSION="$(grep -E '^jax==' "$LOCK" | cut -d= -f3)"
  echo "[elmo_jax] installing $LOCK + libtpu + jax-cuda12-plugin==$JAX_VERSION into $VENV" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet -r "$LOCK" "jax[tpu]==$JAX_VERSION" \
      "jax-cuda12-plugin==$JAX_VERSION" nvidia-cuda-nvcc-cu12 >&2
  "$VENV/bin/python" -m pip install --quiet --no-deps -e . >&2
  echo "$WANT" > "$STAMP"
fi
exec "$VENV/bin/python" -m elmo_jax plan "$@"
