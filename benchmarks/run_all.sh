#!/usr/bin/env bash
# Re-measures every measured figure of the docs and the README on this machine, writes each run as a record of
# the results store (benchmarks/record.py: the machine's fingerprint, commit, load before and after), then
# renders the pages from the store (python benchmarks/figures.py --write). The default sweep: under 45 minutes
# on 2 cores (the last one: serving 4, latency 4, portable 1, long 1, embedding 2, original 4, tests 8, training
# 6 minutes, about 30, with the waits for a quiet machine on top).
#
#   bash benchmarks/run_all.sh                              # all: latency, original, portable, serving, long,
#                                                           #      embedding, cluster, training, tests
#   bash benchmarks/run_all.sh --only=latency,serving       # some of them
#   bash benchmarks/run_all.sh --only=input,coldstart,resume,devices,tokencache,dedupe,bucket
#                                                           # figures outside the default sweep (~35 min more)
#   bash benchmarks/run_all.sh --only=plan                  # the planner's compile analyses for TPU / GPU
#                                                           # targets (no timing: any load; .venv-plan)
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

# the default sweep (about 40 minutes on 2 cores; cluster: about 10); the rest only when --only names them (about 40 minutes more):
# input (3 min), coldstart (10 min with AllenNLP), resume (8 min), devices (4 min), tokencache (4 min), dedupe
# (5 min), bucket (3 min: fake-gcs-server); plan (compiles, no timing: about 15 min, any load)
DEFAULT="latency,original,portable,serving,long,embedding,cluster,training,tests"
wants() { [[ ",${ONLY/#all/$DEFAULT}," == *",$1,"* ]]; }

wait_quiet() {
  local waited=0
  [ -n "$SMOKE" ] && return 0
  while awk -v q="$QUIET" '{exit !($1 >= q)}' /proc/loadavg && [ "$waited" -lt "$WAIT_S" ]; do
    sleep 15; waited=$((waited + 15))
  done
}

# measure NAME RECORD SOURCES [--ratio=... --env=K=V ...] -- COMMAND...: one benchmark into one record
# (--env: a variable of the benchmark's environment, named in the record's command; --python: the interpreter
# that runs it; --compiled_for=TARGET: a compile analysis for TARGET, no timing, so no wait for a quiet machine).
measure() {
  local name="$1" rec="$2" sources="$3"; shift 3
  local extra=() envs=() py="$PY" compiled=""  # --ratio / --flops / --floor / --compiled_for for record.py
  while [ "$1" != "--" ]; do
    case "$1" in
      --env=*) envs+=("${1#--env=}") ;;
      --python=*) py="${1#--python=}" ;;
      --compiled_for=*) compiled=1; extra+=("$1") ;;
      *) extra+=("$1") ;;
    esac
    shift
  done
  shift
  wants "$name" || return 0
  [ -n "$compiled" ] || wait_quiet
  local load; load="$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "[run_all] $name: ${envs[*]} $* (load $load)" >&2
  local json; json="$(mktemp)"
  env PYTHONPATH=. "${envs[@]}" "$py" "$@" > "$json"
  local shown=python; [ "$py" = "$PY" ] || shown="$py"  # another interpreter: its venv names the stack
  "$PY" benchmarks/record.py --out="$OUT/$rec.json" --root="$OUT" --command="${envs[*]:+${envs[*]} }$shown $*" \
      --sources="$sources" --load_before="$load" "${extra[@]}" < "$json"
  rm -f "$json"
}

# plan: the planner's compile analyses (elmo-jax plan under XLA's TPU / GPU compilers on this CPU, no device:
# bytes, FLOPs and bounds, not timings, so no wait for a quiet machine); one record per target, its machine
# this CPU and the target (benchmarks/plan_sweep.py --record_dir). PLAN_PYTHON: a Python with libtpu and the
# CUDA plugin of the pinned jax (scripts/plan.sh sets up .venv-plan); PLAN_PYTHON312, where it exists, the same
# for Python 3.12's jax (PYTHON=python3.12 bash scripts/plan.sh: .venv-plan-py312) into plan/jax-0.12/.
plan() {
  wants plan || return 0
  local py="${PLAN_PYTHON:-.venv-plan/bin/python}" hlo="${PLAN_HLO:-/tmp/elmo_plan_hlo}"
  local rows targets
  for spec in "128:v5e:2x2,v5e:8x8,v5e:16x16,h200:1x1x8" "256:v5e:2x2" "512:h200:1x1x8"; do
    rows="${spec%%:*}"; targets="${spec#*:}"
    echo "[run_all] plan: rows $rows, $targets" >&2
    PYTHONPATH=. "$py" benchmarks/plan_sweep.py --out="$hlo/rows_$rows" --rows="$rows" --targets="$targets" \
        --flag=--eval=false --record_dir="$OUT/plan" --record_root="$OUT" > /dev/null
  done
  local py312="${PLAN_PYTHON312:-.venv-plan-py312/bin/python}"  # the newer stack (docs/accelerator-stacks.md)
  if [ -x "$py312" ]; then
    for spec in "512:h200:1x1x8" "256:v5e:2x2"; do
      rows="${spec%%:*}"; targets="${spec#*:}"
      PYTHONPATH=. "$py312" benchmarks/plan_sweep.py --out="$hlo/py312_rows_$rows" --rows="$rows" \
          --targets="$targets" --flag=--eval=false --record_dir="$OUT/plan/jax-0.12" --record_root="$OUT" > /dev/null
    done
  fi
  for target in h200:1x1x8 v5e:2x2; do
    measure plan "plan/embed_original_${target/:/_}" "elmo_jax/plan,elmo_jax/measure,elmo_jax/embedding" \
        --python="$py" --compiled_for="$target" -- -m elmo_jax plan --step=embed --model=original --target="$target" --json
  done
  measure plan plan/lm1b_eval_h200_1x1x8_rows128 "elmo_jax/plan,elmo_jax/measure,elmo_jax/training,elmo_jax/model,configs/lm1b.py" \
      --python="$py" --compiled_for=h200:1x1x8 -- \
      -m elmo_jax plan --config=configs/lm1b.py --target=h200:1x1x8 --per_device_batch=128 --json   # the eval step
  measure plan plan/traffic_check_v5e_2x2 "elmo_jax/plan,elmo_jax/measure,benchmarks/plan_traffic_check.py" \
      --python="$py" --compiled_for=v5e:2x2 -- benchmarks/plan_traffic_check.py --target=v5e:2x2 --rows=128
}

# outside the default sweep (--only names them): the figures the pages still show from before the store.
# With --smoke, the same benchmarks on the small preset and a few lines (a minute or two each).
extra_sweep() {
  local feed="elmo_jax/data,elmo_jax/training/feed.py,benchmarks/input_pipeline.py"
  local cli="$EMB,elmo_jax/cli/embed.py"
  local train="elmo_jax/training,elmo_jax/model,elmo_jax/data,benchmarks/train_throughput.py"
  local input=() cold=() resume=() few=() steps=() bucket=(--rounds=3)
  if [ -n "$SMOKE" ]; then
    input=(--seconds=0.3); cold=(--num_sentences=16 --allennlp_path=); resume=(--lines=300 --small_lines=50)
    few=(--num_sentences=32 --passes=1); steps=(--steps=1); bucket=(--steps=4 --log_every=2 --checkpoint_every=4 --rounds=1)
  fi
  measure input pipeline/input_pipeline "$feed" \
      --ratio=prepare_two_over_one=prepare_tokens_per_s.2/prepare_tokens_per_s.1 -- \
      benchmarks/input_pipeline.py "${input[@]}"
  measure coldstart embedding/embed_cli_cold_start "$cli,benchmarks/embed_cli_cold_start.py" -- \
      benchmarks/embed_cli_cold_start.py "${cold[@]}"
  measure resume embedding/embed_resume_small "$cli,benchmarks/embed_resume.py" -- \
      benchmarks/embed_resume.py "${resume[@]}"
  measure devices embedding/embed_devices_small "$EMB,benchmarks/embed_throughput.py" \
      --env=XLA_FLAGS=--xla_force_host_platform_device_count=8 -- \
      benchmarks/embed_throughput.py --devices=8 --nosplit --noembed_file --notoken_cache "${few[@]}"
  measure tokencache embedding/embed_token_cache_small "$EMB,benchmarks/embed_throughput.py" \
      --ratio=token_cache_speedup=small.token_cache.cached.tokens_per_s/small.token_cache.char_path.tokens_per_s -- \
      benchmarks/embed_throughput.py --nosplit --noembed_file "${few[@]}"
  measure dedupe training/train_dedupe_small "$train" \
      --ratio=dedupe_speedup=train.small.tokens_per_s/train.small.dedupe.tokens_per_s_plain \
      --flops=train.small.tokens_per_s=train.small.train_flops_per_token -- \
      benchmarks/train_throughput.py --configs=small --nolstm_compare --nosplit "${steps[@]}"
  measure bucket training/bucket_ops "elmo_jax/runtime,elmo_jax/training,benchmarks/bucket_ops.py" -- \
      benchmarks/bucket_ops.py "${bucket[@]}"
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
  # the benchmarks without --options_file: the small preset on a few lines (a minute or two each)
  extra_sweep
  measure cluster cluster/ray_embed_small "$EMB,elmo_jax/engines,benchmarks/ray_embed.py" -- \
      benchmarks/ray_embed.py "$T" --lines=200 --rounds=1 --original_lines=0 --beam_lines=0
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
    --flops=small.batch_64.steady.tokens_per_s=small.useful_flops_per_token \
    --flops=small.batch_64.embed_file.tokens_per_s=small.useful_flops_per_token -- \
    benchmarks/embed_throughput.py --nosplit --notoken_cache
CLUSTER="$EMB,elmo_jax/engines,elmo_jax/cli/embed.py,elmo_jax/cli/embed_ray.py,benchmarks/ray_embed.py"
measure cluster cluster/ray_embed_small "$CLUSTER" -- benchmarks/ray_embed.py   # .venv-beam: scripts/test_beam.sh
measure training training/train_throughput_small "elmo_jax/training,elmo_jax/model,elmo_jax/data,benchmarks/train_throughput.py" \
    --flops=train.small.tokens_per_s=train.small.train_flops_per_token -- \
    benchmarks/train_throughput.py --configs=small --nosplit --nodedupe_compare --lstm_rounds=3
measure tests tests/test_times "tests,elmo_jax,benchmarks/test_times.py" -- benchmarks/test_times.py
extra_sweep
plan
if [ "$OUT" = results ]; then
  "$PY" benchmarks/figures.py --write
  "$PY" benchmarks/stale.py
fi
