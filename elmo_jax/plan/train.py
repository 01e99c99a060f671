"""The train step's plan: compile the real train (and eval) step for a target without its hardware.

    elmo-jax plan --config=configs/lm1b.py --target=v5e:8x8 --per_device_batch=256

`plan(config, target)` lowers and compiles `training.step.make_train_step` on abstract devices
(`targets.make_target`) with abstract inputs (nothing is allocated, nothing runs) and reads the compiler's
memory analysis and the optimized HLO (`measure.roofline.analyse_hlo`): per device, HBM against the chip's
memory (FITS / DOES NOT FIT), matmul FLOPs with loop trip counts, collective bytes by kind and the largest collectives, kernel
launches per LSTM loop (GPUs), and a roofline step time: the largest of compute at the chip's bf16 peak, HBM
traffic at its bandwidth, collectives at its interconnect bandwidth and (GPUs) kernel launches.
A compile that runs out of memory is a result (DOES NOT FIT with the compiler's numbers), not an error.
"""
from __future__ import annotations

import re
from typing import Any

from elmo_jax.formats import options as options_lib
from elmo_jax.measure import flops as flops_lib
from elmo_jax.measure import hlo as hlo_lib
from elmo_jax.measure import roofline
from elmo_jax.measure.chips import LAUNCH_US, Target
from elmo_jax.model import make_model
from elmo_jax.plan import targets as targets_lib
from elmo_jax.runtime import storage
from elmo_jax.training import optimizer as optimizer_lib
from elmo_jax.training import step as step_lib
from elmo_jax.training.config import BatchSizeError, global_batch_size

DEFAULT_ROWS = 128  # bilm-tf's batch per GPU (the embed step's default)


def _out_of_memory(error: Exception) -> dict[str, Any] | None:
  """The compiler's numbers from an out-of-memory compile error, or None if it is another error."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "exceeds available" not in text and "out of memory" not in text.lower():
    return None
  first = next((line for line in text.splitlines() if "exceed" in line or "RESOURCE_EXHAUSTED" in line), text)
  used = re.search(r"\(([\d.]+)([GMK])\) exceeds available \w+ \(([\d.]+)([GMK])\)", text)
  scale = {"G": 2**30, "M": 2**20, "K": 2**10}
  out: dict[str, Any] = {"compiler_message": first.strip()[:500]}
  if used:
    out["temporaries"] = int(float(used.group(1)) * scale[used.group(2)])
    out["capacity"] = int(float(used.group(3)) * scale[used.group(4)])
  return out


def abstract_inputs(config, model, optimizer, mesh, vocab: int, global_batch: int, table_size: int):
  """(state, batch) as ShapeDtypeStructs with the trainer's shardings, and the state shardings."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  create = lambda: step_lib.create_train_state(model, optimizer, vocab, global_batch, config.seed)
  abstract = jax.eval_shape(create)
  shardings = step_lib.state_shardings(abstract, mesh, bool(config.shard_softmax))
  state = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
  rows = step_lib.batch_sharding(mesh)
  b, t, c = global_batch, config.unroll_steps, model.config.max_characters_per_token
  spec = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)
  batch = {"fwd_targets": spec((b, t)), "bwd_targets": spec((b, t)), "weights": spec((b, t), jnp.float32)}
  if config.dedupe_tokens:
    batch.update(token_chars=spec((mesh.devices.size, table_size, c)), fwd_index=spec((b, t)), bwd_index=spec((b, t)))
  else:
    batch.update(fwd_chars=spec((b, t, c)), bwd_chars=spec((b, t, c)))
  return state, batch, shardings



def rows_per_device(config, n_devices: int, per_device_batch: int = 0) -> int:
  """`per_device_batch`, else the config's rows per device as the trainer takes them on `n_devices`
  (`training.config.global_batch_size`); raises TargetError (one line) when the config's batch gives none."""
  if per_device_batch:
    return per_device_batch
  try:
    return global_batch_size(config.batch_size, config.per_device_batch_size, n_devices) // n_devices
  except BatchSizeError as e:
    raise targets_lib.TargetError(f"{e}; or pass --per_device_batch") from None


def plan(config, target_spec: str, per_device_batch: int = 0, vocab_size: int = 0,
         table_size: int = 0, launch_us: float = LAUNCH_US, with_eval: bool = True,
         dump_hlo: str = "") -> dict[str, Any]:
  """Compiles the train step of `config` for `target_spec` at `per_device_batch` rows per device; a report.

  `per_device_batch`: 0 = the config's, as the trainer takes it on this many devices
  (config.per_device_batch_size, or config.batch_size split over them).
  `vocab_size`: 0 = config.data.vocab_max_size. `table_size`: deduped char-CNN table per device
  (config.dedupe_tokens), 0 = half the positions of one window, bucketed as the trainer does.
  """

  target = targets_lib.make_target(target_spec)
  n = target.n
  rows = rows_per_device(config, n, per_device_batch)
  options = options_lib.validate(config.options.to_dict(), "config.options")
  report, table = _header(config, options, target_spec, target, rows, vocab_size, table_size, launch_us)
  model = make_model(options, dropout=config.dropout, dtype=config.dtype, unroll=config.scan_unroll)
  optimizer = optimizer_lib.make_optimizer(config)
  mesh = step_lib.make_mesh(target.devices)
  state, batch, shardings = abstract_inputs(config, model, optimizer, mesh, report["vocab"],
                                            report["global_batch"], table)
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, report["num_sampled"])
  capacity = int(target.hbm_bytes)
  compiled, report["hbm_bytes"], report["fits"] = _compile(train_step, (state, batch), capacity)
  if compiled is None:
    return report
  text = compiled.as_text()
  if dump_hlo:  # one object in a bucket, or a renamed temp file: never half an HLO dump
    storage.write_bytes(dump_hlo, text.encode())
  report.update(roofline.analyse_hlo(text, target, report["tokens_per_device_per_step"], launch_us))
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  report["compiler_flops_loops_once"] = float(cost["flops"]) if cost and "flops" in cost else None
  # The config's token budget (lm1b: 10 epochs) at the roofline rate of this many devices.
  # The config's token budget: its global batch on this target (per_device_batch_size x these devices).
  config_batch = config.batch_size or config.per_device_batch_size * n
  config_tokens = int(config.num_train_steps) * config_batch * report["unroll_steps"]
  rate = report["roofline"]["tokens_per_s_per_device"] * n
  report["config_train_tokens"] = config_tokens
  report["config_train_hours"] = config_tokens / rate / 3600 if rate else None
  if with_eval:
    report["eval"] = _plan_eval(step_lib.make_eval_step(model, mesh, shardings.params),
                                (state.params, state.lstm_state, batch), capacity)
  return report


def _header(config, options: dict[str, Any], target_spec: str, target: Target, rows: int,
            vocab_size: int, table_size: int, launch_us: float) -> tuple[dict[str, Any], int]:
  """(the report's part known before compiling: batch, vocabulary, analytic FLOPs, the chip's peaks; the
  deduped char-CNN table rows per device, which the abstract inputs take even without dedupe)."""
  n = target.n
  vocab = int(vocab_size or config.data.vocab_max_size)
  unroll = int(config.unroll_steps)
  dedupe = bool(config.dedupe_tokens)
  counted = flops_lib.train_flops_per_token(config, options, vocab, rows, table_size)
  table, num_sampled, analytic = counted["table_size"], counted["num_sampled"], counted["forward"]
  tokens = rows * unroll
  report = {
      "target": target_spec, "chip": target.chip.name, "devices": n, "per_device_batch": rows,
      "global_batch": rows * n, "unroll_steps": unroll, "tokens_per_device_per_step": tokens,
      "vocab": vocab, "num_sampled": num_sampled, "dtype": config.dtype, "dedupe_table_size": table if dedupe else 0,
      "shard_softmax": bool(config.shard_softmax),
      "analytic_train_flops_per_token": counted["train"], "analytic_forward_flops_per_token": analytic,
      "peak": {"bf16_flops": target.chip.peak_flops, "hbm_bytes_per_s": target.chip.hbm_bandwidth,
               "collective_bytes_per_s": target.chip.collective_bandwidth,
               "cross_host_bytes_per_s": target.chip.cross_host_bandwidth,
               "launch_us": launch_us if target.chip.platform == "cuda" else None},
  }
  return report, table


def _plan_eval(eval_step, args, capacity: int) -> dict[str, Any]:
  """The eval step's part of the report: whether it fits, its HBM, and (if it compiled) FLOPs and collectives."""
  compiled, hbm, fits = _compile(eval_step, args, capacity)
  out: dict[str, Any] = {"fits": fits, "hbm_bytes": hbm}
  if compiled is not None:
    module = hlo_lib.Module(compiled.as_text())
    out.update(flops_per_device_per_step=module.flops(),
               collective_bytes_per_device=roofline.by_kind(module.collectives()))
  return out


def _compile(jitted, args, capacity: int):
  """(compiled or None, HBM bytes per device, fits) of `jitted(*args)`; out of memory is a result."""
  try:
    compiled = jitted.lower(*args).compile()
  except Exception as e:  # pylint: disable=broad-except
    oom = _out_of_memory(e)
    if oom is None:
      raise
    return None, {"capacity": oom.pop("capacity", capacity), **oom}, False
  m = compiled.memory_analysis()
  hbm = {"arguments": int(m.argument_size_in_bytes), "temporaries": int(m.temp_size_in_bytes),
         "outputs": int(m.output_size_in_bytes), "aliased": int(m.alias_size_in_bytes)}
  hbm["total"] = hbm["arguments"] + hbm["temporaries"] + hbm["outputs"] - hbm["aliased"]
  hbm["capacity"] = capacity
  return compiled, hbm, bool(capacity == 0 or hbm["total"] <= capacity)
