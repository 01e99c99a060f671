#!/usr/bin/env bash
# Run on a machine WITH the package index, before a session on a GPU machine that has none: downloads into .whl/
# (ignored by git; ELMO_JAX_WHEELS=DIR for another folder) exactly the Python 3.12 x86_64 wheels that the GPU image
# lacks: the runtime dependencies of pyproject.toml at requirements-py312.txt's versions, less every package the
# image ships (scripts/device_image.txt). Never jax, jaxlib or a CUDA plugin: the image's own are used.
# Then copy the repository with its .whl/ to the GPU machine and run scripts/device_check.sh there (offline).
#   bash scripts/device_wheels.sh            # any Python >= 3.11 with pip; ~60 MB, a minute
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source scripts/python.sh
PY="$(elmo_python "${PYTHON:-python3}")" || { echo "[device_wheels] no Python (set PYTHON=/path/to/python3)" >&2; exit 2; }
DEST="${ELMO_JAX_WHEELS:-.whl}"
LOCK=requirements-py312.txt
# The lock's packages that are published only as source (pure Python): built here into wheels first.
SOURCE_ONLY="promise"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# The image's Python and machine: CPython 3.12 on x86_64 Linux (glibc 2.39 takes manylinux 2.17 to 2.39).
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --platform manylinux2014_x86_64)
for v in $(seq 39 -1 17); do TARGET+=(--platform "manylinux_2_${v}_x86_64"); done
# Off 3.12, an older pip (23.2, Python 3.11's) checks Requires-Python in `install --dry-run --target` against the
# running interpreter, not --python-version ("Package 'jax' requires a different Python: 3.11.7 not in '>=3.12'").
# The lock's pins were resolved on 3.12, so every one of them takes 3.12: the check is skipped there.
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || TARGET+=(--ignore-requires-python)
PIP=("$PY" -m pip --disable-pip-version-check)

"$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
  > "$TMP/runtime.txt"
for name in $SOURCE_ONLY; do
  "${PIP[@]}" wheel --quiet --no-deps -w "$TMP/built" "$(grep -i -E "^$name==" "$LOCK")" 2>&1 | grep -v '^WARNING: Location' >&2 || true
done
echo "[device_wheels] resolving pyproject.toml's dependencies at $LOCK's versions for CPython 3.12 x86_64" >&2
"${PIP[@]}" install --quiet --dry-run --ignore-installed --target "$TMP/none" --report "$TMP/report.json" \
  "${TARGET[@]}" --find-links "$TMP/built" -r "$TMP/runtime.txt" -c "$LOCK" 2>&1 | grep -v '^WARNING: Location' >&2 || true
[ -s "$TMP/report.json" ] || { echo "[device_wheels] pip could not resolve the dependencies (see above)" >&2; exit 1; }
# name==version of each resolved package the image lacks (names compared as PyPI normalizes them).
"$PY" - "$TMP/report.json" scripts/device_image.txt > "$TMP/wanted.txt" <<'EOF'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(l.strip()) for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")}
never = lambda n: n in ("jax", "jaxlib") or n.startswith(("jax-cuda", "jax-rocm", "nvidia-", "libtpu"))
for item in json.load(open(sys.argv[1]))["install"]:
  name = norm(item["metadata"]["name"])
  if name not in image and not never(name):
    print(f"{name}=={item['metadata']['version']}")
EOF
mkdir -p "$DEST"
echo "[device_wheels] downloading $(wc -l < "$TMP/wanted.txt") wheels into $DEST" >&2
"${PIP[@]}" download --quiet --no-deps "${TARGET[@]}" --find-links "$TMP/built" -d "$TMP/wheels" -r "$TMP/wanted.txt" \
  2>&1 | grep -v '^WARNING: Location' >&2 || true
[ "$(ls "$TMP/wheels" | wc -l)" -eq "$(wc -l < "$TMP/wanted.txt")" ] || {
  echo "[device_wheels] got $(ls "$TMP/wheels" | wc -l) of $(wc -l < "$TMP/wanted.txt") wheels (see above)" >&2; exit 1; }
# Exactly these: a wheel left from another lock would be installed beside them.
rm -f "$DEST"/*.whl
mv "$TMP/wheels"/*.whl "$DEST"/
cp "$TMP/wanted.txt" "$DEST/MANIFEST.txt"
echo "[device_wheels] $DEST: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1); next, on the GPU machine: bash scripts/device_check.sh --out=DIR" >&2
