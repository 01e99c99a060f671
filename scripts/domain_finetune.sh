#!/usr/bin/env bash
# Domain fine-tuning of the biLM, measured (bilm-tf's restart on new text):
#   1. a source model on data/pd-small (trained here, or SOURCE=<an existing workdir>, e.g. runs/default),
#   2. its perplexity on NEW_DIR/test.txt.gz and on data/pd-small/test.txt.gz,
#   3. fine-tuning on NEW_DIR/train.txt.gz from it (init_from), softmax alone for FREEZE steps first,
#   4. both perplexities again, and OUT/domain_finetune.json with before/after.
#
#   scripts/domain_finetune.sh NEW_DIR [OUT] [--config.key=value ...]   (flags go to both train.py runs)
#
# The fine-tuned run keeps the source vocabulary (--config.data.vocab_file=SOURCE/vocab.txt): the softmax
# comes along and the before/after perplexities count the same targets, so they compare. A vocabulary
# rebuilt from the new corpus would give a new softmax and perplexities over other word sets.
# Environment: PYTHON (python), SOURCE (train one into OUT/source), SOURCE_CONFIG (configs/default.py),
# FT_STEPS (500), FREEZE (100), FT_LR (2e-3: half the default's Adam rate), NICE (0: nice level).
set -euo pipefail
NEW=${1:-}
if [[ -z "$NEW" || ! -f "$NEW/train.txt.gz" || ! -f "$NEW/test.txt.gz" ]]; then
  echo "usage: $0 NEW_DIR [OUT] [--config.key=value ...]: pass a folder with train.txt.gz, valid.txt.gz and test.txt.gz of the new domain (one sentence per line)" >&2
  exit 2
fi
shift
OUT=runs/domain_finetune
if [[ $# -gt 0 && "$1" != --* ]]; then OUT=$1; shift; fi
NEW=$(realpath "$NEW"); OUT=$(realpath -m "$OUT")
PY=(nice -n "${NICE:-0}" "${PYTHON:-python}")
CONFIG=${SOURCE_CONFIG:-configs/default.py}
SRC=$(realpath -m "${SOURCE:-$OUT/source}")
FT=$OUT/finetuned
VALID=$NEW/valid.txt.gz
[[ -f "$VALID" ]] || VALID=""
mkdir -p "$OUT"
cd "$(dirname "$(realpath "$0")")/.."  # the repository: configs/ and data/pd-small are relative to it

if [[ -z "${SOURCE:-}" ]]; then
  echo "== source model on data/pd-small -> $SRC (resumes / skips if already trained)"
  "${PY[@]}" train.py --config="$CONFIG" --workdir="$SRC" "$@"
fi
[[ -f "$SRC/export/weights.hdf5" && -f "$SRC/vocab.txt" ]] || { echo "$SRC has no export/ or vocab.txt: not a finished training run" >&2; exit 2; }

perplexity() {  # workdir, text, output dir
  "${PY[@]}" evaluate.py --task=perplexity --workdir="$1" --text_file="$2" --output_dir="$3" --noprogress
}
echo "== before: $SRC"
perplexity "$SRC" "$NEW/test.txt.gz" "$OUT/eval/before_new"
perplexity "$SRC" data/pd-small/test.txt.gz "$OUT/eval/before_source"

echo "== fine-tuning on $NEW/train.txt.gz -> $FT"
"${PY[@]}" train.py --config="$CONFIG" --workdir="$FT" --config.init_from="$SRC" \
  --config.data.train_files="$NEW/train.txt.gz" --config.data.eval_files="$VALID" \
  --config.data.vocab_file="$SRC/vocab.txt" --config.freeze_bilm_steps="${FREEZE:-100}" \
  --config.num_train_steps="${FT_STEPS:-500}" --config.learning_rate="${FT_LR:-2e-3}" "$@"

echo "== after: $FT"
perplexity "$FT" "$NEW/test.txt.gz" "$OUT/eval/after_new"
perplexity "$FT" data/pd-small/test.txt.gz "$OUT/eval/after_source"

"${PYTHON:-python}" - "$OUT" "$SRC" "$FT" "$NEW" <<'EOF'
import json, os, sys
out, src, ft, new = sys.argv[1:]
keys = ("ppl", "ppl_forward", "ppl_backward", "unigram_ppl", "oov_rate", "n_tokens")
read = lambda name: {k: v for k, v in json.load(open(os.path.join(out, "eval", name, "perplexity.json"))).items()
                     if k in keys}
result = {"source_run": src, "finetuned_run": ft, "new_domain_test": os.path.join(new, "test.txt.gz"),
          "source_domain_test": "data/pd-small/test.txt.gz",
          "finetune_config": json.load(open(os.path.join(ft, "config.json"))),
          "new_domain": {"before": read("before_new"), "after": read("after_new")},
          "source_domain": {"before": read("before_source"), "after": read("after_source")}}
for part in ("new_domain", "source_domain"):
  result[part]["ppl_change"] = result[part]["after"]["ppl"] / result[part]["before"]["ppl"] - 1
path = os.path.join(out, "domain_finetune.json")
with open(path + ".tmp", "w") as f:
  json.dump(result, f, indent=1)
os.replace(path + ".tmp", path)
for part, name in (("new_domain", "new domain"), ("source_domain", "pd-small (forgetting)")):
  r = result[part]
  print(f"{name:22s} test ppl {r['before']['ppl']:8.1f} -> {r['after']['ppl']:8.1f} ({r['ppl_change']:+.1%})")
print(f"wrote {path}")
EOF
