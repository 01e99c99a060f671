"""How the LSTM scans write their per-step arrays: stacked outputs into buffers never zero-filled, and the bf16
path's saved activations and rounded gate gradients in the form each compiler fuses best (`lstm.py` runs the
recurrence; this module only decides how its arrays are written, never what they hold).

How the bfloat16 path writes its two per-step [D, B, 4H] arrays (the saved activations forward, the gate
gradients backward) depends on the compiler, measured by the planner's HBM-traffic count (README, "Each
compiler's form of the step's arrays"). XLA:GPU gives an in-place dynamic-update-slice (a scan output) and a
reduction each a kernel of their own that reads its inputs again: written as one elementwise expression over
4H (a select on the gate index, never a concatenate), the saved activations are computed from the gates alone,
and the gate gradients and their bias sum come from one kernel. XLA:TPU fuses concatenates into those writes
and pays a relayout for the select form, so it gets the concatenates and four per-gate sums; so does XLA:CPU,
where the select form's tanh and sigmoid of every element made a compute-bound step 20-40% slower. Both forms
give the same numbers element by element; only the bias sum's order of additions may differ
(tests/model/test_lstm_bf16.py).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.runtime import compat


def scan_into_buffers(step, init, xs, length: int, reverse: bool = False, unroll: int = 1):
  """`lax.scan(step, init, xs, length, reverse, unroll)` with the stacked outputs written into buffers that
  are never zero-filled (`lax.empty`, XLA:TPU's and GPU's AllocateBuffer): `lax.scan` fills its output arrays
  with zeros before the loop overwrites every row, a write of each [T, ...] output per call (4.0 GB of an lm1b
  H200 step at 512 rows). The same values; on CPU `lax.empty` is zeros as before."""
  varying = tuple(sorted(set().union(*map(compat.varying_axes, jax.tree_util.tree_leaves((init, xs))))))
  y_shapes = jax.eval_shape(lambda c, x: step(c, x)[1], init, jax.tree_util.tree_map(lambda a: a[0], xs))

  def empty(y):
    buf = jax.lax.empty((length,) + tuple(y.shape), y.dtype)
    return compat.pcast_varying(buf, varying) if varying else buf

  def body(carry, inputs):
    state, bufs = carry
    x, t = inputs
    state, y = step(state, x)
    bufs = jax.tree_util.tree_map(lambda b, v: jax.lax.dynamic_update_index_in_dim(b, v, t, 0), bufs, y)
    return (state, bufs), None

  (final, ys), _ = jax.lax.scan(body, (init, jax.tree_util.tree_map(empty, y_shapes)), (xs, jnp.arange(length)),
                                reverse=reverse, unroll=unroll)
  return final, ys


def _by_gate(parts: list[jax.Array]) -> jax.Array:
  """[..., H] x 4 -> [..., 4H], `concatenate`'s result as a select on a constant gate index (elementwise)."""
  k = np.arange(4).reshape(4, 1)  # a constant: an iota in a loop body is a kernel per step on GPU
  x = parts[3][..., None, :]
  for i in (2, 1, 0):
    x = jnp.where(k == i, parts[i][..., None, :], x)
  return x.reshape(parts[0].shape[:-1] + (4 * parts[0].shape[-1],))


def saved_gates(g, si, tj, sf, so, dtype) -> jax.Array:
  """The step's four activations [..., 4H] as the backward pass reads them: one write per step, in the matmul
  dtype (with bfloat16 half the bytes of the largest saved array; float32 runs save float32, exactly)."""
  concatenated = functools.partial(saved_gates_concatenated, dtype=dtype)
  if jnp.dtype(dtype) == jnp.float32:  # float32 saves what it always saved, on every platform
    return concatenated(g, si, tj, sf, so)
  return jax.lax.platform_dependent(g, si, tj, sf, so, tpu=concatenated, cpu=concatenated,
                                    default=functools.partial(saved_gates_elementwise, dtype=dtype))


def saved_gates_concatenated(g, si, tj, sf, so, dtype) -> jax.Array:
  """TPU and CPU: the four activations concatenated."""
  del g
  return jnp.concatenate([si, tj, sf, so], axis=-1).astype(dtype)


def saved_gates_elementwise(g, si, tj, sf, so, dtype) -> jax.Array:
  """GPU: each element from its own gate value g [..., 4H] (tanh for j, sigmoid for the others): the kernel that
  writes them reads only g, not four activations another kernel would have to write for it."""
  del si, tj, sf, so
  is_j = np.arange(g.shape[-1]) // (g.shape[-1] // 4) == 1
  return jnp.where(is_j, jnp.tanh(g), jax.nn.sigmoid(g)).astype(dtype)


def rounded_gate_grads(parts: list[jax.Array], dtype) -> tuple[jax.Array, jax.Array]:
  """(dg [D, B, 4H] in `dtype`, its sum over the batch [D, 4H] in float32) from the four float32 gate
  gradients [D, B, H] (i, j, f, o): the bias gradient is summed from the values before they are rounded."""
  per_gate = functools.partial(gate_grads_per_gate, dtype=dtype)
  return jax.lax.platform_dependent(parts, tpu=per_gate, cpu=per_gate,
                                    default=functools.partial(gate_grads_elementwise, dtype=dtype))


def gate_grads_per_gate(parts, dtype) -> tuple[jax.Array, jax.Array]:
  """TPU and CPU: the rounded parts concatenated, and four per-gate sums."""
  return (jnp.concatenate([p.astype(dtype) for p in parts], axis=-1),
          jnp.concatenate([jnp.sum(p, axis=1) for p in parts], axis=-1))


def gate_grads_elementwise(parts, dtype) -> tuple[jax.Array, jax.Array]:
  """GPU: one elementwise [D, B, 4H] array (`_by_gate`), rounded and summed by one kernel."""
  dg = _by_gate(list(parts))
  return dg.astype(dtype), jnp.sum(dg, axis=1)
