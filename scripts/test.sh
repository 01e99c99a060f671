#!/usr/bin/env bash
# Sets up .venv if needed, then runs the test suite (CPU, tiny configs). Extra arguments go to pytest.
source "$(dirname "$0")/env.sh"
exec python -m pytest -q tests "$@"
