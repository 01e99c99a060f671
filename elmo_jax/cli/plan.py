"""Will a config fit on a TPU slice or GPU cluster, and how fast can it go? Compiles without the hardware.

  elmo-jax plan --config=configs/lm1b.py --target=v5e:8x8 --per_device_batch=256
  elmo-jax plan --config=configs/lm1b.py --target=h200:1x1x8 --per_device_batch=512 --json
  elmo-jax plan --config=configs/default.py --target=cpu:8      # no extra package needed
  elmo-jax plan --config=configs/lm1b.py --target=v5e:16x16     # its per_device_batch_size: 128 rows
  elmo-jax plan --step=embed --model=original --target=h200:1x1x8   # the Embedder's step

Targets: v4:AxBxC, v5e:AxB, v5p:AxBxC, v6e:AxB (TPU chips per axis), h100:/h200:PxHxD (partitions x hosts
x GPUs per host), cpu:N. TPU targets need libtpu (pip install -e ".[plan-tpu]"), GPU targets the CUDA
plugin (pip install -e ".[plan-gpu]"); neither needs the hardware. `bash scripts/plan.sh ...` sets up a venv
with both and runs this command. Config overrides as in train.py
(--config.dtype=bfloat16 ...).
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from elmo_jax import cli
from elmo_jax.formats import options as options_lib
from elmo_jax.measure.chips import LAUNCH_US
from elmo_jax.plan import embed as embed_plan
from elmo_jax.plan import targets
from elmo_jax.plan import train as plan_lib
from elmo_jax.plan.train import DEFAULT_ROWS
from elmo_jax.runtime import files
from elmo_jax.runtime.files import gigabytes
from elmo_jax.runtime import storage
from elmo_jax.training import preflight
from elmo_jax.training.config import config_file_error, unknown_override_error

FLAGS = flags.FLAGS


# Flags that only one --step reads: given for the other, they are refused (not silently ignored).
_STEP_FLAGS = {"train": ("config", "vocab_size", "table_size", "launch_us", "eval", "dump_hlo"),
               "embed": ("model", "embed_dtype", "time_buckets")}


def define_flags(argv: list[str] | None = None, flag_values: flags.FlagValues = FLAGS) -> None:
  """Defines the flags (at run time) in `flag_values`; a missing or broken --config file, or an unknown
  --config.key, is one line (train.py's checks), not config_flags' traceback."""
  argv = sys.argv if argv is None else argv
  default = cli.default_config("lm1b")
  if (error := config_file_error(argv, default) or unknown_override_error(argv, default)) is not None:
    sys.exit(f"FATAL Flags parsing error: {error}")
  define = dict(flag_values=flag_values)
  config_flags.DEFINE_config_file("config", default, "Training config (a configs/*.py file).", lock_config=True,
                                  sys_argv=argv,
                                  **define)
  flags.DEFINE_string("target", "v5e:4x4", "Chip and topology, e.g. v5e:16x16, v6e:8x8, v4:4x4x4, v5p:4x4x8, "
                      "h200:1x1x8, h100:1x2x8, cpu:8.", **define)
  flags.DEFINE_integer("per_device_batch", 0, "Batch rows per device (the global batch is this x devices); 0 = "
                       "the config's: config.per_device_batch_size, or config.batch_size split over the devices "
                       f"(--step=embed: {DEFAULT_ROWS}).", **define)
  flags.DEFINE_integer("vocab_size", 0, "Softmax vocabulary (0 = config.data.vocab_max_size).", **define)
  flags.DEFINE_integer("table_size", 0, "Deduped char-CNN table per device (config.dedupe_tokens); 0 = half "
                       "the positions of one window, bucketed.", **define)
  flags.DEFINE_float("launch_us", LAUNCH_US, "GPU targets: microseconds charged per kernel launch.",
                     **define)
  flags.DEFINE_bool("eval", True, "Also compile the eval step (full softmax) and say whether it fits.", **define)
  flags.DEFINE_bool("json", False, "Print one JSON object instead of the report.", **define)
  flags.DEFINE_enum("step", "train", ["train", "embed"], "What to plan: the config's train step, or the "
                    "Embedder's step of --model (HBM per device, the largest batch per --time_buckets).", **define)
  flags.DEFINE_string("model", "original", "--step=embed: an options preset (small, medium, original).", **define)
  flags.DEFINE_enum("embed_dtype", "float32", ["float32", "bfloat16"], "--step=embed: the Embedder's matmul "
                    "dtype (its default: float32).", **define)
  flags.DEFINE_list("time_buckets", ["64", "512"], "--step=embed: time buckets to find the largest batch of.",
                    **define)
  flags.DEFINE_string("dump_hlo", "", "Write the optimized HLO text of the train step to this file.", **define)


def check_flags(f: flags.FlagValues) -> None:
  """Every flag, before JAX starts or anything compiles: one line naming the flag (targets.TargetError).

  The target's shape, counts in range, flags of the other --step, --time_buckets, the --model preset, the
  config (`preflight.check_values`, train.py's checks) and --dump_hlo (never over the config it reads)."""
  targets.parse(f.target)
  other = next(s for s in _STEP_FLAGS if s != f.step)
  for given in (n for n in f if n.split(".")[0] in _STEP_FLAGS[other] and f[n].present):  # --config.x too
    raise targets.TargetError(f"--{given} is a flag of --step={other}; --step={f.step} does not read it")
  cli.check_flag_numbers(targets.TargetError,
                         at_least=((f["per_device_batch"], 0), (f["vocab_size"], 0), (f["table_size"], 0)),
                         within=((f["launch_us"], "a number >= 0", lambda x: x >= 0),))
  if 0 < f.vocab_size < 4:
    raise targets.TargetError(f"--vocab_size must hold <S>, </S>, <UNK> and a word (>= 4; 0 = "
                              f"config.data.vocab_max_size), got {f.vocab_size}")
  if f.step == "embed":
    if not f.time_buckets or not all(t.strip().isdigit() and int(t) >= 1 for t in f.time_buckets):
      raise targets.TargetError(f"--time_buckets={','.join(f.time_buckets)}: give token counts >= 1, comma-"
                                "separated, e.g. --time_buckets=64,512")
    try:
      options_lib.validate(options_lib.preset(f.model))
    except options_lib.OptionsError as e:
      raise targets.TargetError(f"--model={f.model}: {e}") from None
    return
  config = f.config
  if f.per_device_batch:  # the flag replaces the config's batch (`plan.train.rows_per_device`)
    config = config.copy_and_resolve_references()
    config.batch_size, config.per_device_batch_size = 0, f.per_device_batch
  try:
    preflight.check_values(config)
  except preflight.PreflightError as e:
    raise targets.TargetError(str(e)) from None
  if f.dump_hlo:  # never over the config it reads
    try:
      storage.check_output(f.dump_hlo, "--dump_hlo", inputs=[config_flags.get_config_filename(f["config"])])
    except files.UnsafeOutputError as e:
      raise targets.TargetError(str(e)) from None


def render(r: dict) -> str:
  """The human-readable report of `plan()`."""
  hbm = r["hbm_bytes"]
  lines = [f"{r['target']}: {r['devices']} x {r['chip']}, {r['per_device_batch']} rows x {r['unroll_steps']} "
           f"tokens per device (global batch {r['global_batch']}), {r['dtype']}, vocab {r['vocab']:,}, "
           f"{'sampled softmax ' + str(r['num_sampled']) if r['num_sampled'] else 'full softmax'}"
           f"{', shard_softmax' if r['shard_softmax'] else ''}"]
  if not r["fits"]:
    lines.append(f"train step: DOES NOT FIT in {gigabytes(hbm.get('capacity'))} per device"
                 + (f" (temporaries {gigabytes(hbm['temporaries'])})" if "temporaries" in hbm else ""))
    if "compiler_message" in hbm:
      lines.append(f"  compiler: {hbm['compiler_message']}")
    return "\n".join(lines)
  lines.append(f"train step: FITS: {gigabytes(hbm['total'])} of {gigabytes(hbm['capacity'])} per device "
               f"(arguments {gigabytes(hbm['arguments'])}, temporaries {gigabytes(hbm['temporaries'])}, "
               f"outputs {gigabytes(hbm['outputs'])}, aliased {gigabytes(hbm['aliased'])})")
  if "eval" in r:
    e = r["eval"]
    used = e["hbm_bytes"].get("total", e["hbm_bytes"].get("temporaries"))
    lines.append(f"eval step:  {'FITS' if e['fits'] else 'DOES NOT FIT'}: {gigabytes(used)} per device")
  lines.append(f"FLOPs per device per step (matmul + conv, loop trip counts applied): "
               f"{r['flops_per_device_per_step'] / 1e12:.3f} T = {r['flops_per_token'] / 1e9:.3f} GFLOP per token "
               f"(analytic {r['analytic_train_flops_per_token'] / 1e9:.3f})")
  on_chip = r["hbm_traffic_all_spaces_bytes_per_step"] - r["hbm_traffic_bytes_per_step"]
  lines.append(f"HBM traffic per step (estimate): {gigabytes(r['hbm_traffic_bytes_per_step'])}"
               + (f" (+ {gigabytes(on_chip)} of operands in on-chip memory, not counted)" if on_chip else "")
               + "; the largest kernels:")
  for k in r["hbm_traffic_by_kernel"][:8]:
    lines.append(f"  {k['bytes_per_step'] / 1e9:6.2f} GB  {k['op']:<12} {k['bytes'] / 1e6:9,.1f} MB x {k['count']:<4} "
                 f"{k['shape'][:50]:<50} {k['op_name'][-50:]}")
  coll = r["collective_bytes_per_device"]
  lines.append("collectives per device per step: "
               + (", ".join(f"{k} {gigabytes(v)}" for k, v in coll.items()) or "none"))
  for c in r["largest_collectives"]:
    lines.append(f"  {c['op']:<18} {c['dtype']}[{','.join(map(str, c['shape']))}] {c['bytes'] / 1e6:,.1f} MB"
                 + (f" x {c['count']}" if c["count"] > 1 else ""))
  if r["peak"]["launch_us"] is not None:
    lines.append(f"kernel launches per step: {r['kernel_launches_per_step']:,} = "
                 f"{r['kernel_launches_per_step'] * r['peak']['launch_us'] / 1e3:.2f} ms at {r['peak']['launch_us']:g} us each")
    for loop in r["loops"]:
      if loop["trip_count"] > 1:
        lines.append(f"  loop {loop['op_name'][-60:] or loop['name']}: {loop['kernels_per_iteration']} kernels x "
                     f"{loop['trip_count']} iterations = {loop['launches_per_step']:,} launches")
  rf = r["roofline"]
  terms = ", ".join(f"{k.removesuffix('_s')} {v * 1e3:.2f} ms" for k, v in rf.items()
                    if k.endswith("_s") and k != "step_s")
  lines.append(f"roofline step: {rf['step_s'] * 1e3:.2f} ms (bound by {rf['bound_by']}; {terms}) -> "
               f"{rf['tokens_per_s_per_device']:,.0f} tokens/s per device, MFU bound {rf['mfu_bound']:.1%}")
  if r.get("config_train_hours"):
    tokens = r["config_train_tokens"]
    amount = f"{tokens / 1e9:.2f}B" if tokens >= 1e9 else f"{tokens / 1e6:.1f}M"
    hours = r["config_train_hours"]
    lines.append(f"the config's {amount} training tokens (num_train_steps x global batch x unroll_steps): "
                 f"{f'{hours:.1f} h' if hours >= 1 else f'{hours * 60:.1f} min'} on {r['devices']} devices at that rate")
  return "\n".join(lines)


def main(argv, flag_values: flags.FlagValues = FLAGS):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  f = flag_values
  try:
    check_flags(f)
  except targets.TargetError as e:
    sys.exit(f"plan: error: {e}")
  logging.set_verbosity(logging.ERROR)
  # Deviceless: compile for the target, run nothing; the host backend is the CPU (on a TPU VM too), and no
  # TPU is opened, so two planners may run at once (libtpu's lockfile otherwise refuses the second).
  import jax  # pylint: disable=g-import-not-at-top
  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  chip, topo = targets.parse(f.target)
  if chip == "cpu" and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={int(topo)}").strip()
  try:
    if f.step == "embed":
      options = options_lib.validate(options_lib.preset(f.model))
      report = embed_plan.plan_embed(options, f.target, [int(t) for t in f.time_buckets],
                                     f.per_device_batch or plan_lib.DEFAULT_ROWS, dtype=f.embed_dtype)
      print(json.dumps(report, indent=1) if f.json else embed_plan.render(report))
      return
    report = plan_lib.plan(f.config, f.target, f.per_device_batch, f.vocab_size, f.table_size, f.launch_us,
                           f.eval, f.dump_hlo)
  except targets.TargetError as e:
    sys.exit(f"plan: error: {e}")
  print(json.dumps(report, indent=1) if f.json else render(report))


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
