# Sourced by scripts/train.sh and scripts/test.sh: creates .venv on first use and keeps it in sync with
# requirements.txt (reinstalls when the file changes). Needs python3 >= 3.10 (3.11 is what is pinned).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[elmo_jax] creating .venv with $($PY --version 2>&1)" >&2
  "$PY" -m venv .venv
fi
STAMP=.venv/.requirements.sha256
WANT="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "[elmo_jax] installing requirements into .venv (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip >&2
  .venv/bin/python -m pip install --quiet -r requirements.txt >&2
  .venv/bin/python -m pip install --quiet --no-deps -e . >&2
  echo "$WANT" > "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
