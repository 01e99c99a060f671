#!/usr/bin/env bash
# Sets up .venv if needed, then runs the test suite (CPU, tiny configs). Extra arguments go to pytest.
# PYTHON=python3.12 bash scripts/test.sh: the same on the newest jax (requirements-py312.txt in .venv-py312).
# Two pytest-xdist workers by default, a test file on one worker (tests/conftest.py says which files share one);
# ELMO_JAX_TEST_WORKERS=N for another count, 0 (or `-n 0` among the arguments) for one serial process.
ELMO_JAX_TEST_DEPS=1  # env.sh also installs requirements-test.txt (the exactness tests' reference packages)
source "$(dirname "$0")/env.sh"
WORKERS="${ELMO_JAX_TEST_WORKERS:-2}"
if [ "$WORKERS" = "0" ]; then
  exec python -m pytest -q tests "$@"
fi
exec python -m pytest -q -n "$WORKERS" --dist=loadscope tests "$@"
