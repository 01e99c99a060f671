#!/usr/bin/env bash
# The first hour on a GPU machine without internet, as one command. Needs the image's Python 3.12 with its jax,
# jaxlib and CUDA plugin, and this repository with the .whl/ folder scripts/device_wheels.sh filled elsewhere:
#   bash scripts/device_check.sh --out=/tmp/elmo_gpu           # writes gpu_check.json, gpu_check.log, profile/
# Installs .whl/ with --no-index --no-deps into a target folder (--target=DIR, default .whl/site; never into the
# image's site-packages, never a jax), prints the stack it found (Python, jax, jaxlib, CUDA plugin, backend,
# device kind), then runs benchmarks/gpu_check.py under an 8-minute limit (--limit=SECONDS). Exit status: the
# check's (124: the limit was reached). Options: --wheels=DIR (default .whl), --python=PY (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="" WHEELS=.whl TARGET="" LIMIT=480 PY="${PYTHON:-python3}"
for a in "$@"; do
  case "$a" in
    --out=*) OUT="${a#--out=}";;
    --wheels=*) WHEELS="${a#--wheels=}";;
    --target=*) TARGET="${a#--target=}";;
    --limit=*) LIMIT="${a#--limit=}";;
    --python=*) PY="${a#--python=}";;
    *) echo "[device_check] unknown argument '$a' (--out=DIR --wheels=DIR --target=DIR --limit=SECONDS --python=PY)" >&2
       exit 2;;
  esac
done
[ -n "$OUT" ] || { echo "[device_check] say where the results go: --out=DIR" >&2; exit 2; }
TARGET="${TARGET:-$WHEELS/site}"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || {
  echo "[device_check] no wheels in $WHEELS/: run 'bash scripts/device_wheels.sh' on a machine with the package index and copy $WHEELS/ here" >&2
  exit 2; }
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || {
  echo "[device_check] $WHEELS/ holds Python 3.12 wheels; $PY is $("$PY" --version 2>&1). Use --python=python3.12" >&2; exit 2; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# Installed once per set of wheels (a stamp of their names); a folder of its own, put first on PYTHONPATH.
STAMP="$TARGET/.wheels.sha256"
WANT="$(ls "$WHEELS"/*.whl | xargs -n1 basename | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "[device_check] installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS/ into $TARGET (offline)" >&2
  rm -rf "$TARGET"
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --quiet --no-index --no-deps --no-compile \
    --disable-pip-version-check --target "$TARGET" "$WHEELS"/*.whl >&2
  echo "$WANT" > "$STAMP"
fi
export PYTHONPATH="$ROOT:$TARGET${PYTHONPATH:+:$PYTHONPATH}"
unset PYTHONDONTWRITEBYTECODE

"$PY" - <<'EOF' | tee "$OUT/stack.txt" >&2
import importlib.metadata as md, platform
def v(name):
  try:
    return md.version(name)
  except md.PackageNotFoundError:
    return "-"
import jax
plugins = {n: v(n) for n in ("jax-cuda13-plugin", "jax-cuda12-plugin", "jax-cuda13-pjrt", "jax-cuda12-pjrt") if v(n) != "-"}
devices = jax.devices()
print(f"[device_check] Python {platform.python_version()}; jax {jax.__version__}, jaxlib {v('jaxlib')}; "
      f"CUDA plugin {plugins or 'none'}; flax {v('flax')}, optax {v('optax')}, orbax-checkpoint {v('orbax-checkpoint')}, "
      f"grain {v('grain')}, numpy {v('numpy')}")
print(f"[device_check] backend {jax.default_backend()}: {len(devices)} x {devices[0].device_kind}")
EOF

echo "[device_check] benchmarks/gpu_check.py (at most ${LIMIT}s) -> $OUT/gpu_check.json, profile in $OUT/profile" >&2
set +e
GPU_CHECK_PROFILE_DIR="$OUT/profile" timeout --kill-after=20 "$LIMIT" "$PY" benchmarks/gpu_check.py \
  > "$OUT/gpu_check.json.tmp" 2> >(tee "$OUT/gpu_check.log" >&2)
STATUS=$?
set -e
if [ "$STATUS" -eq 0 ]; then
  mv "$OUT/gpu_check.json.tmp" "$OUT/gpu_check.json"
  echo "[device_check] done: $OUT/gpu_check.json" >&2
else
  mv "$OUT/gpu_check.json.tmp" "$OUT/gpu_check.partial.json"
  echo "[device_check] gpu_check.py exited $STATUS (124: past ${LIMIT}s); $OUT/gpu_check.log says why" >&2
fi
exit "$STATUS"
