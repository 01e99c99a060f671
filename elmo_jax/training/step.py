"""Train state and the jit-compiled, data-parallel train/eval steps (the optimizer: `optimizer.py`).

Data parallelism: one `Mesh` axis "data" over every device of every process; the global batch (and the
carried LSTM state, whose rows belong to batch rows) is split along it, params and optimizer state are
replicated (or, with `shard_softmax`, the softmax split along P). The loss and gradients are a
`jax.shard_map` over that axis, so every device computes only its own rows and the step's collectives are
the gradient reduction and the loss sums: per-device work does not grow with the device count (left to
GSPMD, XLA all-gathered the LSTM gate activations of the whole global batch onto every device). No `pmap`.
"""
from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elmo_jax.model import BiLM, zero_state
from elmo_jax.runtime import compat
from elmo_jax.training import losses

DATA_AXIS = "data"


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any  # {"bilm": BiLM params, "softmax": {"W": [V, P], "b": [V]}}
  opt_state: Any
  lstm_state: Any  # (c [L, 2, B, H], h [L, 2, B, P]) carried across windows per batch row
  rng: jax.Array  # raw uint32 key, so checkpoints hold plain arrays


def make_mesh(devices=None) -> Mesh:
  devices = np.asarray(jax.devices() if devices is None else devices)
  return Mesh(devices.reshape(-1), (DATA_AXIS,))


def init_params(model: BiLM, vocab_size: int, rng: jax.Array) -> dict[str, Any]:
  cfg = model.config
  k_model, k_softmax = jax.random.split(rng)
  dummy = jnp.zeros((1, 1, cfg.max_characters_per_token), jnp.int32)
  bilm = model.init(k_model, dummy, dummy, method=BiLM.lm_windows)["params"]
  # bilm-tf: softmax W ~ N(0, 1/sqrt(P)), b = 0.
  w = jax.random.normal(k_softmax, (vocab_size, cfg.projection_dim)) / np.sqrt(cfg.projection_dim)
  return {"bilm": bilm, "softmax": {"W": w, "b": jnp.zeros((vocab_size,))}}


def create_train_state(model: BiLM, optimizer, vocab_size: int, global_batch: int, seed: int,
                       params: dict[str, Any] | None = None) -> TrainState:
  rng = jax.random.PRNGKey(seed)
  rng, k_init = jax.random.split(rng)
  if params is None:
    params = init_params(model, vocab_size, k_init)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                    lstm_state=zero_state(model.config, global_batch), rng=rng)


def state_shardings(state: TrainState, mesh: Mesh, shard_softmax: bool = False) -> TrainState:
  """Params and optimizer state replicated, carried LSTM state split by batch row.

  With `shard_softmax`, the softmax `W` [V, P] and its optimizer state are split along P over the mesh
  (V, 793,471 for lm1b, does not divide by device counts; P = 512 does): each device keeps 1/n of the
  largest tensor and its Adagrad accumulator, and the step moves only the softmax rows it uses
  (`take_split_rows`: the sampled rows all-gathered, their gradient reduce-scattered) instead of
  all-reducing the dense [V, P] gradient. Losses equal the replicated layout's.
  """
  replicated = NamedSharding(mesh, P())
  n = mesh.devices.size
  split_p = NamedSharding(mesh, P(None, DATA_AXIS))

  def place(path, leaf):
    in_softmax = any(getattr(k, "key", None) == "softmax" for k in path)
    if shard_softmax and in_softmax and len(leaf.shape) == 2 and leaf.shape[1] % n == 0:
      return split_p
    return replicated

  shardings = state.replace(params=jax.tree_util.tree_map_with_path(place, state.params),
                            opt_state=jax.tree_util.tree_map_with_path(place, state.opt_state))
  shardings = jax.tree_util.tree_map(lambda x: x if isinstance(x, NamedSharding) else replicated, shardings)
  return shardings.replace(lstm_state=lstm_state_sharding(mesh))


def lstm_state_sharding(mesh: Mesh) -> tuple[NamedSharding, NamedSharding]:
  """(c, h) [L, 2, batch, ...] split by batch row over the mesh."""
  rows = NamedSharding(mesh, P(None, None, DATA_AXIS))
  return (rows, rows)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batch arrays (and deduped token tables [shards, U, C]) split along their first axis over the mesh."""
  return NamedSharding(mesh, P(DATA_AXIS))


def _specs(shardings: Any) -> Any:
  return jax.tree_util.tree_map(lambda s: s.spec, shardings)


def _replicated(spec: P) -> bool:
  return all(axis is None for axis in spec)


def _softmax_is_split(param_specs: Any) -> bool:
  """Whether the softmax W is split over the devices (`shard_softmax`); one spec for all params: its own."""
  if isinstance(param_specs, P):
    return not _replicated(param_specs)
  return not _replicated(param_specs["softmax"]["W"])


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _gather_columns(x: jax.Array, dtype) -> jax.Array:
  """Inside the map: this device's columns [..., P/n] of rows every device holds -> all columns [..., P] in
  `dtype`. The gradient is reduce-scattered back in float32 (the transpose of a bfloat16 all-gather would
  sum the devices' contributions in bfloat16)."""
  return jax.lax.all_gather(x.astype(dtype), DATA_AXIS, axis=x.ndim - 1, tiled=True)


def _gather_columns_fwd(x, dtype):
  return _gather_columns(x, dtype), jnp.zeros((), x.dtype)


def _gather_columns_bwd(dtype, like, ct):
  del dtype
  return (jax.lax.psum_scatter(ct.astype(jnp.float32), DATA_AXIS, scatter_dimension=ct.ndim - 1,
                               tiled=True).astype(like.dtype),)


_gather_columns.defvjp(_gather_columns_fwd, _gather_columns_bwd)


def take_split_rows(w: jax.Array, ids: jax.Array, dtype, shared: bool) -> jax.Array:
  """`losses.take_rows` inside the map when the softmax W [V, P] is split along P (`shard_softmax`).

  Shared ids (the sampled candidates, the same on every device): each device takes its columns of those
  rows and all-gathers the columns ([S, P] in `dtype`, its gradient reduce-scattered). A device's own ids
  (its targets): the ids are all-gathered (int32, tiny), each device takes its columns of every device's
  rows, and an all-to-all returns each device its own rows with all columns ([rows, P]).
  """
  if shared:
    return _gather_columns(w[ids], dtype)
  flat = ids.reshape(-1)
  every = jax.lax.all_gather(flat, DATA_AXIS, tiled=True)  # [n * rows]
  cols = w[every].astype(dtype)  # [n * rows, P / n]: my columns of every device's rows
  mine = jax.lax.all_to_all(cols, DATA_AXIS, split_axis=0, concat_axis=1, tiled=True)  # [rows, P]
  return mine.reshape(ids.shape + (mine.shape[-1],))


def _lm_nll(model, params, batch, lstm_state, rng, num_sampled, deterministic, rows=None, split_softmax=False):
  """Token NLLs forward and backward [rows, T] and the new LSTM state of (this device's) `batch`.

  `rows`: (first row, global rows) of this shard, for the dropout masks. `split_softmax`: the softmax W
  is this device's [V, P/n] columns (inside the map), fetched with `take_split_rows`.
  """
  rngs = {} if deterministic else {"dropout": rng}
  if "token_chars" in batch:  # deduped by type on the host (`data.batches.LMIterator`)
    chars_in = {"token_chars": batch["token_chars"], "fwd_index": batch["fwd_index"],
                "bwd_index": batch["bwd_index"]}
    fwd, bwd, new_state = model.apply({"params": params["bilm"]}, None, None, lstm_state, deterministic,
                                      method=BiLM.lm_windows, rngs=rngs, rows=rows, **chars_in)
  else:
    fwd, bwd, new_state = model.apply({"params": params["bilm"]}, batch["fwd_chars"], batch["bwd_chars"],
                                      lstm_state, deterministic, method=BiLM.lm_windows, rngs=rngs, rows=rows)
  w, b = params["softmax"]["W"], params["softmax"]["b"]
  if num_sampled and not deterministic:
    take = take_split_rows if split_softmax else losses.take_rows
    k_f, k_b = jax.random.split(jax.random.fold_in(rng, 1))
    nll_f = losses.sampled_softmax_nll(fwd, batch["fwd_targets"], w, b, k_f, num_sampled, model.dtype, take=take)
    nll_b = losses.sampled_softmax_nll(bwd, batch["bwd_targets"], w, b, k_b, num_sampled, model.dtype, take=take)
  else:
    if split_softmax:
      w = _gather_columns(w, model.dtype)
    nll_f = losses.full_softmax_nll(fwd, batch["fwd_targets"], w, b, model.dtype)
    nll_b = losses.full_softmax_nll(bwd, batch["bwd_targets"], w, b, model.dtype)
  return nll_f, nll_b, new_state


def make_train_step(model: BiLM, optimizer, mesh: Mesh, state_sharding: TrainState, num_sampled: int = 0):
  """Returns jitted `step(state, batch) -> (state, metrics)`; the state is donated.

  The loss and gradients are a `jax.shard_map` over the data axis: each device runs the biLM forward and
  backward on its own rows only (the custom-VJP LSTM and the char CNN see local shapes), and the only
  collectives are the gradient reduction (the transpose of casting the replicated params to
  device-varying: one all-reduce per gradient), the loss sums, and with `shard_softmax` the softmax rows
  (`take_split_rows`). The optimizer update runs on the sharded state outside the map.
  """
  param_specs = _specs(state_sharding.params)
  lstm_specs = _specs(state_sharding.lstm_state)
  split_softmax = _softmax_is_split(param_specs)
  n_devices = mesh.devices.size

  def per_device(params, lstm_state, batch, key):
    local_rows = batch["weights"].shape[0]
    rows = (jax.lax.axis_index(DATA_AXIS) * local_rows, local_rows * n_devices)
    n_tokens = jax.lax.psum(jnp.sum(batch["weights"]), DATA_AXIS)
    n = jnp.maximum(n_tokens, 1.0)

    def loss_fn(params):
      # Replicated params become device-varying here, so their gradients come out per device and the
      # cast's transpose sums them over the devices once (a replicated input's gradient is its psum).
      params = jax.tree_util.tree_map(
          lambda x, spec: compat.pcast_varying(x, DATA_AXIS) if _replicated(spec) else x, params, param_specs)
      nll_f, nll_b, new_state = _lm_nll(model, params, batch, lstm_state, key, num_sampled, False, rows,
                                        split_softmax)
      weights = batch["weights"]
      loss_f = jnp.sum(nll_f * weights) / n  # this device's share of the global mean
      loss_b = jnp.sum(nll_b * weights) / n
      return 0.5 * (loss_f + loss_b), (loss_f, loss_b, new_state)

    (_, (loss_f, loss_b, new_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    loss_f, loss_b = jax.lax.psum((loss_f, loss_b), DATA_AXIS)
    return grads, jax.lax.stop_gradient(new_state), loss_f, loss_b, n_tokens

  losses_and_grads = jax.shard_map(per_device, mesh=mesh,
                                   in_specs=(param_specs, lstm_specs, P(DATA_AXIS), P()),
                                   out_specs=(param_specs, lstm_specs, P(), P(), P()))

  def step(state: TrainState, batch: dict[str, jax.Array]):
    rng, k_step = jax.random.split(state.rng)
    grads, new_lstm, loss_f, loss_b, n_tokens = losses_and_grads(state.params, state.lstm_state, batch, k_step)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {"loss": 0.5 * (loss_f + loss_b), "loss_forward": loss_f, "loss_backward": loss_b,
               "grad_norm": optax.global_norm(grads), "n_tokens": n_tokens}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state, lstm_state=new_lstm,
                         rng=rng), metrics

  replicated = NamedSharding(mesh, P())
  return jax.jit(step, in_shardings=(state_sharding, batch_sharding(mesh)),
                 out_shardings=(state_sharding, replicated), donate_argnums=(0,))


def make_eval_step(model: BiLM, mesh: Mesh, params_sharding: Any):
  """Returns jitted `eval_step(params, lstm_state, batch) -> (lstm_state, sums)` with full softmax, a
  `shard_map` over the data axis as the train step: each device scores its rows, the sums are reduced."""
  param_specs = _specs(params_sharding)  # a tree of shardings, or one for all params
  split_softmax = _softmax_is_split(param_specs)
  lstm_sharding = lstm_state_sharding(mesh)

  def per_device(params, lstm_state, batch):
    nll_f, nll_b, new_state = _lm_nll(model, params, batch, lstm_state, None, 0, True, None, split_softmax)
    w = batch["weights"]
    sums = {"nll_forward": jnp.sum(nll_f * w), "nll_backward": jnp.sum(nll_b * w), "n_tokens": jnp.sum(w)}
    return new_state, jax.lax.psum(sums, DATA_AXIS)

  lstm_specs = _specs(lstm_sharding)
  eval_sums = jax.shard_map(per_device, mesh=mesh, in_specs=(param_specs, lstm_specs, P(DATA_AXIS)),
                            out_specs=(lstm_specs, P()))
  replicated = NamedSharding(mesh, P())
  return jax.jit(eval_sums, in_shardings=(params_sharding, lstm_sharding, batch_sharding(mesh)),
                 out_shardings=(lstm_sharding, replicated))
