"""Will a config fit on a TPU slice or GPU cluster, and how fast can it go? Compiles without the hardware.

  python -m elmo_jax.plan --config=configs/lm1b.py --target=v5e:8x8 --per_device_batch=256
  elmo-jax-plan --config=configs/lm1b.py --target=h200:1x1x8 --per_device_batch=512 --json
  python -m elmo_jax.plan --config=configs/default.py --target=cpu:8      # no extra package needed
  python -m elmo_jax.plan --config=configs/lm1b.py --target=v5e:16x16     # its per_device_batch_size: 128 rows
  python -m elmo_jax.plan --step=embed --model=original --target=h200:1x1x8   # the Embedder's step

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
from elmo_jax.runtime import files
from elmo_jax.runtime import storage

FLAGS = flags.FLAGS


def define_flags() -> None:
  from elmo_jax.plan import DEFAULT_ROWS, targets  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.config import unknown_override_error  # pylint: disable=g-import-not-at-top
  default = cli.default_config("lm1b")
  if (error := unknown_override_error(sys.argv, default)) is not None:
    sys.exit(f"FATAL Flags parsing error: {error}")
  config_flags.DEFINE_config_file("config", default, "Training config (a configs/*.py file).", lock_config=True)
  flags.DEFINE_string("target", "v5e:4x4", "Chip and topology, e.g. v5e:16x16, v6e:8x8, v4:4x4x4, v5p:4x4x8, "
                      "h200:1x1x8, h100:1x2x8, cpu:8.")
  flags.DEFINE_integer("per_device_batch", 0, "Batch rows per device (the global batch is this x devices); 0 = "
                       "the config's: config.per_device_batch_size, or config.batch_size split over the devices "
                       f"(--step=embed: {DEFAULT_ROWS}).")
  flags.DEFINE_integer("vocab_size", 0, "Softmax vocabulary (0 = config.data.vocab_max_size).")
  flags.DEFINE_integer("table_size", 0, "Deduped char-CNN table per device (config.dedupe_tokens); 0 = half "
                       "the positions of one window, bucketed.")
  flags.DEFINE_float("launch_us", targets.LAUNCH_US, "GPU targets: microseconds charged per kernel launch.")
  flags.DEFINE_bool("eval", True, "Also compile the eval step (full softmax) and say whether it fits.")
  flags.DEFINE_bool("json", False, "Print one JSON object instead of the report.")
  flags.DEFINE_enum("step", "train", ["train", "embed"], "What to plan: the config's train step, or the "
                    "Embedder's step of --model (HBM per device, the largest batch per --time_buckets).")
  flags.DEFINE_string("model", "original", "--step=embed: an options preset (small, medium, original).")
  flags.DEFINE_enum("embed_dtype", "float32", ["float32", "bfloat16"], "--step=embed: the Embedder's matmul "
                    "dtype (its default: float32).")
  flags.DEFINE_list("time_buckets", ["64", "512"], "--step=embed: time buckets to find the largest batch of.")
  flags.DEFINE_string("dump_hlo", "", "Write the optimized HLO text of the train step to this file.")


def _gb(x) -> str:
  return "?" if x is None else f"{x / 1e9:.2f} GB"


def render(r: dict) -> str:
  """The human-readable report of `plan()`."""
  hbm = r["hbm_bytes"]
  lines = [f"{r['target']}: {r['devices']} x {r['chip']}, {r['per_device_batch']} rows x {r['unroll_steps']} "
           f"tokens per device (global batch {r['global_batch']}), {r['dtype']}, vocab {r['vocab']:,}, "
           f"{'sampled softmax ' + str(r['num_sampled']) if r['num_sampled'] else 'full softmax'}"
           f"{', shard_softmax' if r['shard_softmax'] else ''}"]
  if not r["fits"]:
    lines.append(f"train step: DOES NOT FIT in {_gb(hbm.get('capacity'))} per device"
                 + (f" (temporaries {_gb(hbm['temporaries'])})" if "temporaries" in hbm else ""))
    if "compiler_message" in hbm:
      lines.append(f"  compiler: {hbm['compiler_message']}")
    return "\n".join(lines)
  lines.append(f"train step: FITS: {_gb(hbm['total'])} of {_gb(hbm['capacity'])} per device (arguments "
               f"{_gb(hbm['arguments'])}, temporaries {_gb(hbm['temporaries'])}, outputs {_gb(hbm['outputs'])}, "
               f"aliased {_gb(hbm['aliased'])})")
  if "eval" in r:
    e = r["eval"]
    lines.append(f"eval step:  {'FITS' if e['fits'] else 'DOES NOT FIT'}: {_gb(e['hbm_bytes'].get('total', e['hbm_bytes'].get('temporaries')))} per device")
  lines.append(f"FLOPs per device per step (matmul + conv, loop trip counts applied): "
               f"{r['flops_per_device_per_step'] / 1e12:.3f} T = {r['flops_per_token'] / 1e9:.3f} GFLOP per token "
               f"(analytic {r['analytic_train_flops_per_token'] / 1e9:.3f})")
  lines.append(f"HBM traffic per step (estimate): {_gb(r['hbm_traffic_bytes_per_step'])}; the largest kernels:")
  for k in r["hbm_traffic_by_kernel"][:8]:
    lines.append(f"  {k['bytes_per_step'] / 1e9:6.2f} GB  {k['op']:<12} {k['bytes'] / 1e6:9,.1f} MB x {k['count']:<4} "
                 f"{k['shape'][:50]:<50} {k['op_name'][-50:]}")
  coll = r["collective_bytes_per_device"]
  lines.append("collectives per device per step: " + (", ".join(f"{k} {_gb(v)}" for k, v in coll.items()) or "none"))
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.ERROR)
  # Deviceless: compile for the target, run nothing; the host backend is the CPU (on a TPU VM too), and no
  # TPU is opened, so two planners may run at once (libtpu's lockfile otherwise refuses the second).
  import jax  # pylint: disable=g-import-not-at-top
  if not os.environ.get("JAX_PLATFORMS"):
    jax.config.update("jax_platforms", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from elmo_jax import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import targets  # pylint: disable=g-import-not-at-top
  if FLAGS.dump_hlo and FLAGS.step == "train":  # before the compile: never over the config it reads
    try:
      storage.check_output(FLAGS.dump_hlo, "--dump_hlo", inputs=[config_flags.get_config_filename(FLAGS["config"])])
    except files.UnsafeOutputError as e:
      sys.exit(f"plan: error: {e}")
  try:
    chip, topo = targets.parse(FLAGS.target)
    if chip == "cpu" and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                 f" --xla_force_host_platform_device_count={int(topo)}").strip()
    if FLAGS.step == "embed":
      from elmo_jax.interop import options as options_lib  # pylint: disable=g-import-not-at-top
      from elmo_jax.plan import embed as embed_plan  # pylint: disable=g-import-not-at-top
      try:
        options = options_lib.validate(options_lib.preset(FLAGS.model))
        buckets = [int(t) for t in FLAGS.time_buckets]
      except (options_lib.OptionsError, ValueError) as e:
        sys.exit(f"plan: error: --model / --time_buckets: {e}")
      report = embed_plan.plan_embed(options, FLAGS.target, buckets, FLAGS.per_device_batch or plan_lib.DEFAULT_ROWS,
                                     dtype=FLAGS.embed_dtype)
      print(json.dumps(report, indent=1) if FLAGS.json else embed_plan.render(report))
      return
    report = plan_lib.plan(FLAGS.config, FLAGS.target, FLAGS.per_device_batch, FLAGS.vocab_size,
                           FLAGS.table_size, FLAGS.launch_us, FLAGS.eval, FLAGS.dump_hlo)
  except targets.TargetError as e:
    sys.exit(f"plan: error: {e}")
  print(json.dumps(report, indent=1) if FLAGS.json else render(report))


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
