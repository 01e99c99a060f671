"""The embedding step planned for a target: HBM per device and the largest batch per time bucket that fits.

    elmo-jax plan --step=embed --model=original --target=h200:1x1x8
    elmo-jax plan --step=embed --model=original --target=v5e:2x2 --time_buckets=64,512

Compiles the `Embedder`'s own functions (`embed_step.steps`: the biLM over rows split across the devices,
the char CNN writing into each device's token table) for abstract devices, as `plan.train.plan` does for the
train step. Per time bucket the biLM step is compiled at two batch sizes; its memory is linear in the rows,
so the largest power-of-two batch per device that fits next to the token table is predicted from those two
and then compiled to confirm: twice as many rows must not fit, and a prediction that does not fit moves
down by powers of two (the compiler's layouts and padding make memory not quite linear).
"""
from __future__ import annotations

from typing import Any, Sequence

from elmo_jax.embedding import embedder as embedder_lib
from elmo_jax.embedding import step as embed_step
from elmo_jax.model import BiLM, BiLMConfig
from elmo_jax.plan import targets as targets_lib
from elmo_jax.runtime.files import gigabytes

_PROBE_ROWS = (64, 128)  # per device: the two compiles the linear memory model is fitted on


def plan_embed(options: dict[str, Any], target_spec: str, time_buckets: Sequence[int] = (64, 512),
               per_device_batch: int = 64, cnn_cache_tokens: int = 0, dtype: str = "float32") -> dict[str, Any]:
  """A report: HBM per device of the biLM step at `per_device_batch`, of the char-CNN step and the token
  table, and per time bucket the largest power-of-two rows per device that fit."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import train as train_plan  # pylint: disable=g-import-not-at-top

  compile_ = train_plan._compile  # pylint: disable=protected-access  (the train planner's: OOM is a result)
  target = targets_lib.make_target(target_spec)
  n, capacity = target.n, int(target.hbm_bytes)
  config = BiLMConfig.from_options(options)
  model = BiLM(config, dtype=jnp.bfloat16 if dtype == "bfloat16" else jnp.float32)
  mesh = Mesh(np.array(target.devices), (embed_step.AXIS,))
  steps = embed_step.steps(model, mesh)
  replicated, by_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P(embed_step.AXIS))
  dummy = jnp.zeros((1, 1, config.max_characters_per_token), jnp.int32)
  params = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                                  jax.eval_shape(lambda: model.init(jax.random.key(0), dummy)["params"]))
  p = config.projection_dim
  table_rows = (cnn_cache_tokens or embedder_lib._CNN_CACHE_TOKENS) + 1  # pylint: disable=protected-access
  table = jax.ShapeDtypeStruct((n, table_rows, p), jnp.float32, sharding=by_rows)  # one per device
  constants = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                                     jax.eval_shape(steps.constants, params))
  param_bytes = sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree_util.tree_leaves((params, constants)))

  def bilm_hbm(rows: int, time: int):
    emb = jax.ShapeDtypeStruct((rows * n, time, p), jnp.float32, sharding=by_rows)
    mask = jax.ShapeDtypeStruct((rows * n, time), jnp.bool_, sharding=by_rows)
    _, hbm, fits = compile_(steps.bilm, (params, constants, emb, mask), capacity)
    return hbm, fits

  chunk_rows = n * embed_step.CNN_ROWS
  ids = jax.ShapeDtypeStruct((chunk_rows, config.max_characters_per_token), jnp.int32, sharding=by_rows)
  dest = jax.ShapeDtypeStruct((chunk_rows,), jnp.int32, sharding=by_rows)
  _, cnn_hbm, _ = compile_(steps.cnn_into, (params, table, ids, dest), capacity)
  table_bytes = table_rows * p * 4
  report: dict[str, Any] = {
      "step": "embed", "target": target_spec, "chip": target.chip.name, "devices": n, "dtype": dtype,
      "model": {"lstm_dim": config.lstm_dim, "projection_dim": p, "n_layers": config.n_layers},
      "param_bytes": param_bytes, "token_table_bytes": table_bytes, "hbm_capacity": capacity,
      "cnn_step_hbm_bytes": cnn_hbm, "per_device_batch": per_device_batch, "buckets": []}
  budget = capacity - table_bytes  # the token table stays on every device beside the biLM step's own memory
  for time in time_buckets:
    report["buckets"].append(_bucket(bilm_hbm, time, per_device_batch, capacity, budget))
  return report


def _bucket(bilm_hbm, time: int, per_device_batch: int, capacity: int, budget: int) -> dict[str, Any]:
  """One time bucket's part of the report: HBM at `per_device_batch`, and the largest power-of-two rows per
  device within `budget`, predicted from the linear fit of two probe compiles, then confirmed by compiling.

  `bilm_hbm(rows, time)` -> (HBM dict, fits) compiles the biLM step at `rows` per device."""
  entry: dict[str, Any] = {"time": int(time)}
  hbm, fits = bilm_hbm(per_device_batch, time)
  entry["hbm_bytes_at_batch"] = hbm
  entry["fits_at_batch"] = fits
  (r0, r1) = _PROBE_ROWS
  h0, _ = bilm_hbm(r0, time)
  h1, _ = bilm_hbm(r1, time)
  if "total" not in h0 or "total" not in h1:
    entry["largest_rows_per_device"] = 0
    return entry
  per_row = (h1["total"] - h0["total"]) / (r1 - r0)
  fixed = h0["total"] - per_row * r0
  predicted = int((budget - fixed) // per_row) if per_row > 0 else 1 << 20
  rows = 1 << max(0, predicted.bit_length() - 1)

  def within_budget(hbm: dict[str, Any], fits: bool) -> bool:
    return fits and hbm.get("total", capacity) <= budget

  hbm, fits = bilm_hbm(rows, time)
  if within_budget(hbm, fits):  # the prediction fits: confirm that twice as many rows do not
    while True:
      bigger_hbm, bigger_fits = bilm_hbm(2 * rows, time)
      if not within_budget(bigger_hbm, bigger_fits):
        break
      rows *= 2
      hbm = bigger_hbm
  else:
    while rows > 1 and not within_budget(hbm, fits):
      rows //= 2
      hbm, fits = bilm_hbm(rows, time)
  entry.update(largest_rows_per_device=rows, largest_tokens_per_device=rows * int(time),
               hbm_bytes_at_largest=hbm, bytes_per_row=int(per_row), fixed_bytes=int(fixed))
  return entry


def render(r: dict[str, Any]) -> str:
  """The report of `plan_embed` in a few lines."""
  lines = [f"{r['target']}: {r['devices']} x {r['chip']}, embed step of lstm {r['model']['lstm_dim']} -> "
           f"{r['model']['projection_dim']} x {r['model']['n_layers']} layers, {r['dtype']}; params "
           f"{gigabytes(r['param_bytes'])} and token table {gigabytes(r['token_table_bytes'])} on every device "
           f"(of {gigabytes(r['hbm_capacity'])})",
           f"char-CNN step: {gigabytes(r['cnn_step_hbm_bytes'].get('total', 0))} per device"]
  for b in r["buckets"]:
    at = b["hbm_bytes_at_batch"]
    used = gigabytes(at.get("total", at.get("temporaries", 0)))
    lines.append(f"time bucket {b['time']:>4}: {r['per_device_batch']} rows per device "
                 f"{'FIT' if b['fits_at_batch'] else 'DO NOT FIT'} in {used}; "
                 f"largest power of two that fits: {b['largest_rows_per_device']:,} rows per device "
                 f"({b.get('largest_tokens_per_device', 0):,} tokens, "
                 f"{gigabytes(b.get('hbm_bytes_at_largest', {}).get('total', 0))})")
  return "\n".join(lines)
