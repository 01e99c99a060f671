#!/usr/bin/env bash
# Re-measures every measured figure of the docs and the README on this machine, writes each run as a record of
# the results store (benchmarks/record.py: the machine's fingerprint, commit, load before and after), then
# renders the pages from the store (python benchmarks/figures.py --write). Under 45 minutes on 2 cores.
#
#   bash benchmarks/run_all.sh                              # all: latency, original, portable, serving, long,
#                                                           #      embedding, training, tests
#   bash benchmarks/run_all.sh --only=latency,serving       # some of them (also: input, coldstart)
#   bash benchmarks/run_all.sh --smoke=tests/fixtures/bilm_tf/options.json --out=/tmp/store
#                                                           # a tiny model, few calls: the mechanism, no figure
#
# Each benchmark waits until the 1-minute load average is under 1.5 (QUIET=1.5; at most WAIT_S=1800 seconds,
# then it runs and its record says the load). With --out other than results/, the pages are left as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
ONLY=all; OUT=results; SMOKE=""
for arg in "$@"; do
  case "$arg" in
    --only=*) ONLY="${arg#--only=}" ;;
    --out=*) OUT="${arg#--out=}" ;;
    --smoke=*) SMOKE="${arg#--smoke=}" ;;
    *) echo "run_all.sh: unknown argument $arg (--only=a,b --out=DIR --smoke=OPTIONS_JSON)" >&2; exit 2 ;;
  esac
done
QUIET="${QUIET:-1.5}"; WAIT_S="${WAIT_S:-1800}"
EMB="elmo_jax/embedding,elmo_jax/model,elmo_jax/runtime,benchmarks/bench_util.py"

# the default sweep (under 45 minutes on 2 cores); input, coldstart: only when --only names them
DEFAULT="latency,original,portable,serving,long,embedding,training,tests"
wants() { [[ ",${ONLY/#all/$DEFAULT}," == *",$1,"* ]]; }

wait_quiet() {
  local waited=0
  [ -n "$SMOKE" ] && return 0
  while awk -v q="$QUIET" '{exit !($1 >= q)}' /proc/loadavg && [ "$waited" -lt "$WAIT_S" ]; do
    sleep 15; waited=$((waited + 15))
  done
}

# measure NAME RECORD SOURCES [--ratio=...] -- COMMAND...: one benchmark into one record.
measure() {
  local name="$1" rec="$2" sources="$3"; shift 3
  local extra=()  # --ratio / --flops / --floor for record.py
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
  wants "$name" || return 0
  wait_quiet
  local load; load="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "[run_all] $name: $* (load $load)" >&2
  local json; json="$(mktemp)"
  PYTHONPATH=. "$PY" "$@" > "$json"
  "$PY" benchmarks/record.py --out="$OUT/$rec.json" --root="$OUT" --command="python $*" --sources="$sources" \
      --load_before="$load" "${extra[@]}" < "$json"
  rm -f "$json"
}

if [ -n "$SMOKE" ]; then  # a tiny model and a few calls of the four benchmarks that take --options_file
  T="--options_file=$SMOKE"
  measure latency latency/embed_latency_small "$EMB,benchmarks/embed_latency.py,benchmarks/latency_floor.py" -- \
      benchmarks/embed_latency.py "$T" --calls=4 --warmup=1 --batch_sizes=1 --split_calls=2 --nocold_cache \
      --allennlp_path=/nonexistent
  measure portable portable/portable_latency_small "$EMB,elmo_jax/formats,benchmarks/portable_latency.py" -- \
      benchmarks/portable_latency.py "$T" --calls=4 --warmup=1
  measure serving serving/serve_load_small "$EMB,elmo_jax/serving,benchmarks/serve_load.py" \
      --ratio=serve.levels.0.over_direct=serve.levels.0.sentences_per_s/direct.sentences_per_s -- \
      benchmarks/serve_load.py "$T" --clients=1 --requests=4 --warmup=1 --soak_requests=0 --allennlp_path=/nonexistent
  measure long latency/long_sentence_small "$EMB,benchmarks/long_sentence.py" -- \
      benchmarks/long_sentence.py "$T" --lengths=600
  exit 0
fi

measure latency latency/embed_latency_small "$EMB,benchmarks/embed_latency.py,benchmarks/latency_floor.py" \
    --floor=presets.small.warm_cache.batch_1.ms.p50=presets.small.warm_cache.floor.p50_ms -- \
    benchmarks/embed_latency.py --presets=small --calls=150 --warmup=30
measure original latency/embed_latency_original "$EMB,benchmarks/embed_latency.py,benchmarks/latency_floor.py" \
    --floor=presets.original.warm_cache.batch_1.ms.p50=presets.original.warm_cache.floor.p50_ms -- \
    benchmarks/embed_latency.py --presets=original --calls=40 --warmup=10 --batch_sizes=1,4 --split_calls=20
measure portable portable/portable_latency_small "$EMB,elmo_jax/formats,benchmarks/portable_latency.py" -- \
    benchmarks/portable_latency.py --preset=small --calls=300
measure serving serving/serve_load_small "$EMB,elmo_jax/serving,benchmarks/serve_load.py" \
    --ratio=serve.levels.2.over_direct=serve.levels.2.sentences_per_s/direct.sentences_per_s -- \
    benchmarks/serve_load.py --preset=small --soak_requests=5000
measure long latency/long_sentence_small "$EMB,benchmarks/long_sentence.py" -- benchmarks/long_sentence.py
measure embedding embedding/embed_throughput_small "$EMB,benchmarks/embed_throughput.py" \
    --flops=small.batch_64.steady.tokens_per_s=small.useful_flops_per_token -- \
    benchmarks/embed_throughput.py --nosplit --notoken_cache
measure training training/train_throughput_small "elmo_jax/training,elmo_jax/model,elmo_jax/data,benchmarks/train_throughput.py" \
    --flops=train.small.tokens_per_s=train.small.train_flops_per_token -- \
    benchmarks/train_throughput.py --configs=small --nolstm_compare --nosplit
measure input pipeline/input_pipeline "elmo_jax/data,elmo_jax/training/feed.py,benchmarks/input_pipeline.py" -- \
    benchmarks/input_pipeline.py
measure coldstart embedding/embed_cli_cold_start "$EMB,elmo_jax/cli/embed.py,benchmarks/embed_cli_cold_start.py" -- \
    benchmarks/embed_cli_cold_start.py --allennlp_path=
measure tests tests/test_times "tests,elmo_jax,benchmarks/test_times.py" -- benchmarks/test_times.py
if [ "$OUT" = results ]; then
  "$PY" benchmarks/figures.py --write
  "$PY" benchmarks/stale.py
fi
