#!/usr/bin/env bash
# Every released ELMo the project knows, converted into hub-ready safetensors folders with their model cards
# (docs/portable-models.md):
#
#   bash scripts/make_zoo.sh OUT
#
# writes OUT/<name>/ (config.json, model.safetensors, README.md and the lexicons or vocabulary it has) for
#   - small, medium, original, original_5.5B: AllenNLP's four (elmo_jax.sources.pretrained.MODELS), from
#     $ELMO_JAX_MODELS_URL (a mirror with AllenNLP's layout; AllenNLP's bucket when unset);
#   - tfhub-elmo-3: the TF-Hub google/elmo/3 module, an archive at $ZOO_TFHUB_URL;
#   - nlpl-<id>: an NLPL repository ELMo (options.json + model.hdf5), an archive at $ZOO_NLPL_URL;
#   - efml-$ZOO_EFML_LANG: an ELMoForManyLangs language, an archive at $ZOO_EFML_URL (its release links are in
#     https://github.com/HIT-SCIR/ELMoForManyLangs; no default: skipped unless set).
# A URL may be http(s):// or file:// (a local mirror); set one to "" to skip that model. Downloads go to the
# cache ($ELMO_JAX_CACHE); a folder already in OUT is kept, so a rerun continues. Each folder's card records the
# source's sha256s and the layers' max difference from the source (0). Then, with a Hugging Face token:
#
#   for d in OUT/*/; do elmo-jax push --to=hf://OWNER/elmo-$(basename "$d") "$d"; done
#
# PYTHON (default: python) runs elmo_jax.
set -euo pipefail
OUT=${1:-}
if [[ -z "$OUT" ]]; then
  echo "usage: $0 OUT: the folder to write a safetensors model folder per released model into" >&2
  exit 2
fi
PYTHON=${PYTHON:-python}
TFHUB_URL=${ZOO_TFHUB_URL-https://storage.googleapis.com/tfhub-modules/google/elmo/3.tar.gz}
NLPL_URL=${ZOO_NLPL_URL-http://vectors.nlpl.eu/repository/20/199.zip}
EFML_URL=${ZOO_EFML_URL-}
EFML_LANG=${ZOO_EFML_LANG:-zhs}
mkdir -p "$OUT"

convert() {  # NAME SPEC: OUT/NAME from SPEC, unless it is there
  if [[ -z "$2" ]]; then
    echo "[make_zoo] $1: no source given, skipped" >&2
  elif [[ -d "$OUT/$1" ]]; then
    echo "[make_zoo] $1: $OUT/$1 is there, kept" >&2
  else
    echo "[make_zoo] $1: from $2" >&2
    "$PYTHON" -m elmo_jax convert --format=safetensors --from="$2" --to="$OUT/$1"
  fi
}

for name in $("$PYTHON" -c 'from elmo_jax.sources.pretrained import MODELS; print(" ".join(MODELS))'); do
  convert "$name" "$name"
done
convert tfhub-elmo-3 "$TFHUB_URL"
NLPL_ID=$(basename "${NLPL_URL:-none}"); NLPL_ID=${NLPL_ID%%.*}
convert "nlpl-$NLPL_ID" "$NLPL_URL"
convert "efml-$EFML_LANG" "$EFML_URL"
echo "[make_zoo] $OUT: $(ls "$OUT" | tr '\n' ' ')" >&2
