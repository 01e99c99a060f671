#!/usr/bin/env bash
# Apache Beam's tests (tests/engines/test_beam.py, the beam extra) in .venv-beam. Beam 2.78 pins pyarrow < 26 and
# protobuf < 7, below the lock's, so it cannot share .venv: .venv-beam holds apache-beam and what it pins, in front
# of .venv's packages (a .pth file adds .venv's site-packages after its own), so nothing else is installed twice.
# .ci/run runs it after scripts/test.sh; extra arguments go to pytest.
set -euo pipefail
ELMO_JAX_TEST_DEPS=1  # .venv as scripts/test.sh makes it (pytest and the rest come from there)
source "$(dirname "$0")/env.sh"
BEAM="$VENV-beam"
BEAM_PIN="apache-beam==2.78.0"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
if [ ! -x "$BEAM/bin/python" ]; then
  echo "[elmo_jax] creating $BEAM (apache-beam over $VENV's packages)" >&2
  "$PY" -m venv "$BEAM"
fi
echo "import site; site.addsitedir('$(purelib "$VENV/bin/python")')" > "$(purelib "$BEAM/bin/python")/elmo_jax_venv.pth"
STAMP="$BEAM/.requirements.sha256"
WANT="$( (cat "$VENV/.requirements-test.sha256"; echo "$BEAM_PIN") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "[elmo_jax] installing $BEAM_PIN into $BEAM" >&2
  "$BEAM/bin/python" -m pip install --quiet --no-compile "$BEAM_PIN" >&2
  echo "$WANT" > "$STAMP"
fi
exec "$BEAM/bin/python" -m pytest -q -p no:cacheprovider tests/engines/test_beam.py "$@"
