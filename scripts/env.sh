# Sourced by scripts/train.sh and scripts/test.sh: creates .venv on first use and keeps it in sync with
# requirements.txt (reinstalls when the file changes). Needs python3 >= 3.11 (what is pinned).
# requirements.txt is the CPU lock. On a GPU or TPU machine set ELMO_JAX_EXTRA=cuda12 (or tpu) to add the
# accelerator build of the same jax version:  ELMO_JAX_EXTRA=cuda12 bash scripts/train.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
EXTRA="${ELMO_JAX_EXTRA:-}"
case "$EXTRA" in
  ""|cuda12|tpu) ;;
  *) echo "[elmo_jax] ELMO_JAX_EXTRA must be cuda12 or tpu (or unset for CPU), got '$EXTRA'" >&2; exit 2;;
esac
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "[elmo_jax] needs Python >= 3.11; $PY is $("$PY" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  echo "[elmo_jax] creating .venv with $($PY --version 2>&1)" >&2
  "$PY" -m venv .venv
fi
STAMP=.venv/.requirements.sha256
WANT="$( (cat requirements.txt pyproject.toml; [ -z "$EXTRA" ] || echo "extra=$EXTRA") | sha256sum | cut -d' ' -f1)"
# pip --no-compile: no byte-compiling every installed file (torch's and jax's thousands, most never imported;
# that was most of the install's time); Python compiles what is imported, once, into __pycache__ as usual.
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "[elmo_jax] installing requirements into .venv (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install --quiet --no-compile --upgrade pip >&2
  .venv/bin/python -m pip install --quiet --no-compile -r requirements.txt >&2
  if [ -n "$EXTRA" ]; then
    JAX_VERSION="$(grep -E '^jax==' requirements.txt | cut -d= -f3)"
    echo "[elmo_jax] adding jax[$EXTRA]==$JAX_VERSION" >&2
    .venv/bin/python -m pip install --quiet --no-compile "jax[$EXTRA]==$JAX_VERSION" >&2
  fi
  .venv/bin/python -m pip install --quiet --no-compile --no-deps -e . >&2
  echo "$WANT" > "$STAMP"
fi
# scripts/test.sh only (ELMO_JAX_TEST_DEPS=1): the test-only packages, with their own stamp (so train.sh and
# test.sh do not reinstall each other's), which also changes when the main requirements do.
if [ "${ELMO_JAX_TEST_DEPS:-}" = 1 ]; then
  TEST_STAMP=.venv/.requirements-test.sha256
  TEST_WANT="$( (echo "$WANT"; cat requirements-test.txt) | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$TEST_STAMP" 2>/dev/null || true)" != "$TEST_WANT" ]; then
    echo "[elmo_jax] installing the test-only requirements (requirements-test.txt) into .venv" >&2
    .venv/bin/python -m pip install --quiet --no-compile -r requirements-test.txt >&2
    echo "$TEST_WANT" > "$TEST_STAMP"
  fi
fi
export PATH="$ROOT/.venv/bin:$PATH"
# Python keeps the bytecode it compiles (the install above skips that step): with PYTHONDONTWRITEBYTECODE set, as
# some images do, every process would compile every module it imports again, about 2 s of each train.py start.
unset PYTHONDONTWRITEBYTECODE
