# Sourced by scripts/train.sh and scripts/test.sh: creates the venv on first use and keeps it in sync with its
# lock (reinstalls when the file changes). The lock goes with the Python (scripts/python.sh): Python 3.11 gets
# requirements.txt in .venv; PYTHON=python3.12 gets requirements-py312.txt (the newest jax) in .venv-py312.
# The locks are CPU locks. On a GPU or TPU machine set ELMO_JAX_EXTRA=cuda12, cuda13 (or tpu) to add the
# accelerator build of the same jax version:  ELMO_JAX_EXTRA=cuda12 bash scripts/train.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/python.sh
EXTRA="${ELMO_JAX_EXTRA:-}"
case "$EXTRA" in
  ""|cuda12|cuda13|tpu) ;;
  *) echo "[elmo_jax] ELMO_JAX_EXTRA must be cuda12, cuda13 or tpu (or unset for CPU), got '$EXTRA'" >&2; exit 2;;
esac
if ! PY="$(elmo_python "${PYTHON:-python3}")" || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "[elmo_jax] needs Python >= 3.11; ${PYTHON:-python3} is $("${PYTHON:-python3}" --version 2>&1 | head -1). Set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
elmo_lock "$PY"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[elmo_jax] creating $VENV with $($PY --version 2>&1) for $LOCK" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.requirements.sha256"
WANT="$( (cat "$LOCK" pyproject.toml; [ -z "$EXTRA" ] || echo "extra=$EXTRA") | sha256sum | cut -d' ' -f1)"
# pip --no-compile: no byte-compiling every installed file (torch's and jax's thousands, most never imported;
# that was most of the install's time); Python compiles what is imported, once, into __pycache__ as usual.
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "[elmo_jax] installing $LOCK into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install --quiet --no-compile --upgrade pip >&2
  "$VENV/bin/python" -m pip install --quiet --no-compile -r "$LOCK" >&2
  if [ -n "$EXTRA" ]; then
    JAX_VERSION="$(grep -E '^jax==' "$LOCK" | cut -d= -f3)"
    echo "[elmo_jax] adding jax[$EXTRA]==$JAX_VERSION" >&2
    "$VENV/bin/python" -m pip install --quiet --no-compile "jax[$EXTRA]==$JAX_VERSION" >&2
  fi
  "$VENV/bin/python" -m pip install --quiet --no-compile --no-deps -e . >&2
  echo "$WANT" > "$STAMP"
fi
# scripts/test.sh only (ELMO_JAX_TEST_DEPS=1): the test-only packages, with their own stamp (so train.sh and
# test.sh do not reinstall each other's), which also changes when the main requirements do.
if [ "${ELMO_JAX_TEST_DEPS:-}" = 1 ]; then
  TEST_STAMP="$VENV/.requirements-test.sha256"
  TEST_WANT="$( (echo "$WANT"; cat requirements-test.txt) | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$TEST_STAMP" 2>/dev/null || true)" != "$TEST_WANT" ]; then
    echo "[elmo_jax] installing the test-only requirements (requirements-test.txt) into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --no-compile -r requirements-test.txt >&2
    echo "$TEST_WANT" > "$TEST_STAMP"
  fi
fi
export PATH="$ROOT/$VENV/bin:$PATH"
# Python keeps the bytecode it compiles (the install above skips that step): with PYTHONDONTWRITEBYTECODE set, as
# some images do, every process would compile every module it imports again, about 2 s of each train.py start.
unset PYTHONDONTWRITEBYTECODE
