#!/usr/bin/env bash
# The reference experiment (docs/evaluation.md, "Reference run"): seed 003's experiment at the scale of a 2-core CPU.
#   1. trains CONFIG (configs/reference.py: data/pd-mix, about 45 min on 2 CPU cores) into RUN (skipped when
#      RUN/export exists),
#   2. perplexity in domain (data/pd-mix/test) and out of domain (WIKI_DIR/test.txt.gz), + unigram,
#   3. per-layer probes (POS, WSD, sentiment), trained biLM vs its untrained twin,
#   4. task models: --elmo=none vs frozen (SEEDS) vs finetune (FINETUNE_SEEDS) on POS and sentiment,
#   5. sentiment extras: ELMo at the task model's output too, and the biLM first fine-tuned on the task's
#      unlabelled training sentences (the paper's domain adaptation), then frozen,
#   6. copies the small result files (config, metrics.jsonl, JSONs, tables, plots; no weights) into OUT.
#
#   bash scripts/reference.sh PROBE_DIR WIKI_DIR [OUT]
#
# PROBE_DIR holds pos/{train,dev,test}.conll, sentiment/{train,dev,test}.tsv and wsd/wsd.tsv (research data:
# never shipped); WIKI_DIR holds test.txt.gz of the out-of-domain corpus. Every step whose output exists
# is skipped, so an interrupted run continues. Environment: RUN (runs/reference), CONFIG
# (configs/reference.py) and TRAIN_FLAGS (extra --config.key=value flags of the biLM's training; step 5's
# adaptation takes them too, then its own data, steps and optimizer), which repeat the experiment with a
# larger biLM on an accelerator, e.g.
#   TRAIN_FLAGS="--config.options.lstm.dim=2048 --config.options.lstm.projection_dim=256 --config.num_train_steps=50000"
# SEEDS ("0 1 2"),
# FINETUNE_SEEDS ("0"), POS_TRAIN_SENTENCES (4000: a seeded subset keeps a POS run to minutes on a CPU),
# FINETUNE_EPOCHS (4), FINETUNE_LR (1e-4: the biLM's rate when fine-tuned).
set -euo pipefail
PROBES=${1:-}; WIKI=${2:-}; OUT=${3:-results/reference}
if [[ -z "$PROBES" || ! -d "$PROBES/pos" || -z "$WIKI" || ! -f "$WIKI/test.txt.gz" ]]; then
  echo "usage: $0 PROBE_DIR WIKI_DIR [OUT]: PROBE_DIR with pos/ sentiment/ wsd/ probe files, WIKI_DIR with test.txt.gz of an out-of-domain corpus" >&2
  exit 2
fi
source "$(dirname "$0")/env.sh"
RUN=${RUN:-runs/reference}
CONFIG=${CONFIG:-configs/reference.py}; read -r -a TRAIN_FLAGS <<< "${TRAIN_FLAGS:-}"
SEEDS=${SEEDS:-0 1 2}; FINETUNE_SEEDS=${FINETUNE_SEEDS:-0}
DS=$RUN/downstream

[[ -f $RUN/export/weights.hdf5 ]] || python train.py --config="$CONFIG" --workdir="$RUN" "${TRAIN_FLAGS[@]}"
[[ -f $RUN/eval/report.md ]] || python evaluate.py --task=all --workdir="$RUN" --probe_data_dir="$PROBES" \
    --text_file=data/pd-mix/test.txt.gz --output_dir="$RUN/eval" --noprogress
[[ -f $RUN/eval-wiki/perplexity.json ]] || python evaluate.py --task=perplexity --workdir="$RUN" \
    --text_file="$WIKI/test.txt.gz" --output_dir="$RUN/eval-wiki" --noprogress

task_model() {  # task elmo seed [flags...]; NAME (default: elmo) names the run, BILM (RUN) the biLM
  local task=$1 elmo=$2 seed=$3; shift 3
  local dir=$DS/$task-${NAME:-$elmo}-s$seed
  [[ -f $dir/results.json ]] && return 0
  local extra=()
  [[ $task == pos ]] && extra+=(--max_train_sentences="${POS_TRAIN_SENTENCES:-4000}")
  [[ $elmo != none ]] && extra+=(--bilm="${BILM:-$RUN}" --layer_cache_dir="${CACHE:-$DS/cache}")
  python -m elmo_jax downstream --task="$task" --elmo="$elmo" --data_dir="$PROBES" --seed="$seed" \
      --workdir="$dir" --noprogress "${extra[@]}" "$@"
}
for seed in $SEEDS; do
  for task in pos sentiment; do
    task_model "$task" none "$seed"
    task_model "$task" frozen "$seed"
    if [[ " $FINETUNE_SEEDS " == *" $seed "* ]]; then
      task_model "$task" finetune "$seed" --num_epochs="${FINETUNE_EPOCHS:-4}" \
          --bilm_learning_rate="${FINETUNE_LR:-1e-4}"
    fi
  done
done
python -m elmo_jax downstream table "$DS"/pos-*-s* "$DS"/sentiment-{none,frozen,finetune}-s* --output="$DS/summary"

# --- sentiment extras ------------------------------------------------------------------------------------
TUNED=${RUN}_sentdom; TEXT=$TUNED-text  # named after RUN: another RUN must not reuse this one's adapted biLM
if [[ ! -f $TEXT/test.txt.gz ]]; then
  mkdir -p "$TEXT"
  for pair in train:train dev:valid test:test; do  # the sentences of the TSV (label<TAB>text), no labels
    cut -f2- "$PROBES/sentiment/${pair%%:*}.tsv" | gzip > "$TEXT/${pair##*:}.txt.gz"
  done
fi
for t in test; do
  [[ -f $TUNED-before/$t/perplexity.json ]] || python evaluate.py --task=perplexity --workdir="$RUN" \
      --text_file="$TEXT/$t.txt.gz" --output_dir="$TUNED-before/$t" --noprogress
done
# RUN's shape (CONFIG + TRAIN_FLAGS), then one recipe whatever trained RUN: 250 Adam steps of 64 x 20 tokens
# (~2 epochs) of the raw reviews. The later flag wins.
[[ -f $TUNED/export/weights.hdf5 ]] || python train.py --config="$CONFIG" --workdir="$TUNED" "${TRAIN_FLAGS[@]}" \
    --config.init_from="$RUN" --config.data.train_files="$TEXT/train.txt.gz" \
    --config.data.eval_files="$TEXT/valid.txt.gz" --config.data.vocab_file="$RUN/vocab.txt" \
    --config.data.tfds_name= --config.data.prepared_dir= --config.data.prepared_eval_dir= \
    --config.data.pretokenized=false --config.batch_size=64 --config.optimizer=adam \
    --config.num_train_steps=250 --config.learning_rate=1e-3 --config.warmup_steps=20 \
    --config.eval_every_steps=250 --config.checkpoint_every_steps=250
[[ -f $TUNED/eval/test/perplexity.json ]] || python evaluate.py --task=perplexity --workdir="$TUNED" \
    --text_file="$TEXT/test.txt.gz" --output_dir="$TUNED/eval/test" --noprogress
for seed in $SEEDS; do
  NAME=frozenout task_model sentiment frozen "$seed" --elmo_at_output
  NAME=frozendom BILM=$TUNED CACHE=$DS/cache-dom task_model sentiment frozen "$seed"
done
python -m elmo_jax downstream table "$DS"/sentiment-*-s* --output="$DS/sentiment_extras"

mkdir -p "$OUT/downstream"
cp "$RUN/config.json" "$RUN/metrics.jsonl" "$OUT/"
mkdir -p "$OUT/eval" "$OUT/eval-wiki"
cp "$RUN"/eval/*.json "$RUN"/eval/*.png "$RUN"/eval/report.md "$OUT/eval/"
cp "$RUN"/eval-wiki/*.json "$OUT/eval-wiki/"
cp "$DS"/summary/* "$OUT/downstream/"
for d in "$DS"/*-s*; do cp "$d/results.json" "$OUT/downstream/$(basename "$d").json"; done
for f in "$DS"/sentiment_extras/*; do cp "$f" "$OUT/downstream/sentiment_extras.${f##*.}"; done
mkdir -p "$OUT/sentiment_domain"
cp "$TUNED/config.json" "$TUNED/metrics.jsonl" "$OUT/sentiment_domain/"
cp "$TUNED-before/test/perplexity.json" "$OUT/sentiment_domain/perplexity_test_before.json"
cp "$TUNED/eval/test/perplexity.json" "$OUT/sentiment_domain/perplexity_test_after.json"
echo "reference results in $OUT"
