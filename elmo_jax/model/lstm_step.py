"""One LSTMP step, shared by the training scan (`lstm.lstm_scan`) and the inference loops here (`lstm_steps`).

The step is bilm-tf's cell (see `lstm.py`): gates in TF order (i, j, f, o), cell clip, projection and its clip;
padded steps leave (c, h) unchanged and output zeros; a reset step (packed rows: a sentence's first step in its
direction's reading) starts from zeros, as a sentence in a row of its own does. `lstm_steps` runs the first
`n_steps` steps of a sentence batch for inference, in one of two forms chosen by the rows (`HOIST_MAX_ROWS`), with
the same values to float rounding.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from elmo_jax.model.recurrence import saved_gates


class Residuals(NamedTuple):
  """What the forward pass saves per step for the hand-written backward pass, each [T, D, B, ...].

  Four arrays (the four gate activations stacked into one write per step), not the ten per-step values the
  backward pass uses: the cell state before the clip and the projection's input are recomputed
  elementwise from these (the same ops on the same values, so the same numbers; tanh, the costly one, is
  saved), and whether a clip was active is read off the clipped value (|clip(x)| < c iff -c < x < c).
  With bfloat16 matmuls the activations are saved in bfloat16; float32 runs save float32.
  """
  gates: jax.Array  # [..., 4H]: sigmoid(i), tanh(j), sigmoid(f), sigmoid(o), in the matmul dtype
  c_prev: jax.Array  # [..., H]: cell state before the step
  tc: jax.Array  # [..., H]: tanh of the (clipped) new cell state, in the matmul dtype
  h_prev: jax.Array  # [..., P]: projected output before the step


def cell_update(si: jax.Array, tj: jax.Array, sf: jax.Array, c_prev: jax.Array, cell_clip
                ) -> tuple[jax.Array, jax.Array]:
  """(c_raw, c_new) of a step from its gate activations: the cell update before and after the clip.
  Shared by the forward pass and the backward pass's recomputation."""
  c_raw = sf * c_prev + si * tj
  return c_raw, (jnp.clip(c_raw, -cell_clip, cell_clip) if cell_clip else c_raw)


def step_fn(w_h, w_p, cell_clip, proj_clip, dtype, save, bias=None, gx_bias=None):
  """One time step of all directions: ((c, h), (gx_t, mask_t[, reset_t])) -> ((c, h), y_t [, saved values]).

  `reset_t` [D, B] bool (inference on packed rows, `lstm_steps(reset=)`): those rows' (c, h) are zeros before the step.

  With `bias`, the inputs are (x_t, mask_t) and w_h is all of W_0: gates = [x_t; h] @ W_0 + bias.
  With `gx_bias` [D, 4H], gx_t is x_t @ W_x in the matmul dtype: gates = gx_t + gx_bias + h @ W_h in float32.
  """

  def step(carry, inputs):
    c, h = carry
    g, m = inputs[:2]
    if len(inputs) == 3:  # a sentence starts here: the state a row of its own would start from
      fresh = inputs[2][..., None]
      c, h = jnp.where(fresh, 0.0, c), jnp.where(fresh, 0.0, h)
    if isinstance(g, tuple):  # one [B, 4H] slice per direction (`input_gates_split`)
      g = jnp.stack([gk.astype(jnp.float32) for gk in g])
    if gx_bias is not None:
      g = g.astype(jnp.float32) + gx_bias[:, None]
    if bias is None:
      g = g + jnp.einsum("dbp,dpg->dbg", h.astype(dtype), w_h, preferred_element_type=jnp.float32)
    else:
      xh = jnp.concatenate([g.astype(dtype), h.astype(dtype)], axis=-1)
      g = jnp.einsum("dbi,dig->dbg", xh, w_h, preferred_element_type=jnp.float32) + bias[:, None]
    i, j, f, o = jnp.split(g, 4, axis=-1)
    si, tj, sf, so = jax.nn.sigmoid(i), jnp.tanh(j), jax.nn.sigmoid(f), jax.nn.sigmoid(o)
    _, c_new = cell_update(si, tj, sf, c, cell_clip)
    tc = jnp.tanh(c_new)
    m_new = so * tc
    h_raw = jnp.einsum("dbh,dhp->dbp", m_new.astype(dtype), w_p, preferred_element_type=jnp.float32)
    h_new = jnp.clip(h_raw, -proj_clip, proj_clip) if proj_clip else h_raw
    keep = m[..., None]
    y = jnp.where(keep, h_new, 0.0)
    carry = (jnp.where(keep, c_new, c), jnp.where(keep, h_new, h))
    if save:
      return carry, (y, Residuals(saved_gates(g, si, tj, sf, so, dtype), c, tc.astype(dtype), h))
    return carry, y

  return step


# At most this many rows a direction, a step of `lstm_steps` is a matrix-vector product bound by reading its weights:
# the input half of the gate matmul is then hoisted out of the step, for HOIST_CHUNK steps at once, so a step reads
# W_h and W_P only (the `small` preset: 10.0 of 18.1 MiB a step; `original`: 160 of 288 MiB). More rows make the step
# compute-bound, and the fused step keeps the [T, D, B, 4H] gate inputs out of memory.
HOIST_MAX_ROWS = 8
HOIST_CHUNK = 32


class StepWeights(NamedTuple):
  """One layer's weights as `lstm_steps` reads them, both directions stacked (direction 0 = forward)."""
  w_x: jax.Array  # [2, I, 4H]: W_0's input rows
  w_h: jax.Array  # [2, P, 4H]: W_0's recurrent rows
  w_p: jax.Array  # [2, H, P]: W_P_0
  bias: jax.Array  # [2, 4H]: B + the forget bias


def stack_layer(forward: tuple[jax.Array, jax.Array, jax.Array], backward: tuple[jax.Array, jax.Array, jax.Array],
                forget: jax.Array) -> StepWeights:
  """A layer's (W_0 [I + P, 4H], B [4H], W_P_0 [H, P]) of each direction and the forget bias [4H] -> its
  `StepWeights`: one copy of every weight. Made once per call inside a program, or once per model
  (`lstm.stacked_weights`) by a caller that runs many (the Embedder)."""
  in_dim = forward[0].shape[0] - forward[2].shape[1]
  w, b, w_p = (jnp.stack(t) for t in zip(forward, backward))
  return StepWeights(w[:, :in_dim], w[:, in_dim:], w_p, b + forget)


def lstm_steps(x, weights: StepWeights, mask, c0, h0, n_steps, cell_clip=None, proj_clip=None, dtype=jnp.float32,
               reset=None):
  """Inference form of `lstm_scan`: the first `n_steps` steps only.

  Args:
    x: [T, D, B, I] inputs; weights: the layer's `StepWeights`; mask, c0, h0: as `lstm_scan`.
    n_steps: int scalar (may be traced); every step from it on must be padding in every row. Those are
      skipped (a loop with a run-time trip count) with the same result: outputs 0, state unchanged.
    reset: None, or [T, D, B] bool: the state is zeros before those steps (rows that hold several sentences end
      to end, each starting in its direction's reading where the one before ended; `step_fn`).
  Returns:
    outputs [T, D, B, P] and the final (c, h), as `lstm_scan`. Not differentiable (reverse mode).

  B <= HOIST_MAX_ROWS: `lstm_scan`'s ops (x @ W_x + bias, then h @ W_h a step), the input half computed for
  HOIST_CHUNK steps at a time. More rows: gates from one fused matmul per step, [x_t; h] @ W_0, which never
  materialises the [T, D, B, 4H] gate inputs (at inference batch sizes hundreds of MB, which made the pass
  memory-bound and set its peak RSS).
  """
  args = (x, weights, mask, c0, h0, n_steps, reset)
  static = (cell_clip or None, proj_clip or None, dtype)
  rows = x.shape[2]
  if isinstance(rows, int):
    return (_hoisted_steps if rows <= HOIST_MAX_ROWS else _fused_steps)(*args, *static)
  # a symbolic batch (an exported program): the same choice, made when it runs
  return jax.lax.cond(jnp.asarray(rows) <= HOIST_MAX_ROWS, lambda a: _hoisted_steps(*a, *static),
                      lambda a: _fused_steps(*a, *static), args)


def _fused_steps(x, weights, mask, c0, h0, n_steps, reset, cell_clip, proj_clip, dtype):
  """`lstm_steps` of many rows: [x_t; h] @ W_0 a step."""
  w = jnp.concatenate([weights.w_x, weights.w_h], axis=1)  # W_0 of both directions, as stored
  step = step_fn(w.astype(dtype), weights.w_p.astype(dtype), cell_clip, proj_clip, dtype, False, bias=weights.bias)

  def body(t, carry):
    state, out = carry
    state, y = step(state, (x[t], mask[t]) if reset is None else (x[t], mask[t], reset[t]))
    return state, out.at[t].set(y)

  out = jnp.zeros(x.shape[:-1] + (weights.w_p.shape[-1],), jnp.float32)
  final, out = jax.lax.fori_loop(0, n_steps, body, ((c0, h0), out))
  return out, final


def _hoisted_steps(x, weights, mask, c0, h0, n_steps, reset, cell_clip, proj_clip, dtype, chunk=HOIST_CHUNK):
  """`lstm_steps` of few rows: per chunk of `chunk` steps, the input gates at once (x @ W_x + bias, in float32;
  with a narrower matmul dtype rounded, the bias added in the step, as `lstm_scan`), then the chunk's steps that
  are not padding, each h @ W_h (`step_fn`, as `lstm_scan`)."""
  time, d, b, in_dim = x.shape
  proj = weights.w_p.shape[-1]
  wide = jnp.dtype(dtype) == jnp.float32
  step = step_fn(weights.w_h.astype(dtype), weights.w_p.astype(dtype), cell_clip, proj_clip, dtype, False,
                 gx_bias=None if wide else weights.bias)
  w_x = weights.w_x.astype(dtype)
  # `chunk` more steps of padding, so a chunk's slice never runs past the end (a symbolic T stays symbolic)
  x = jnp.pad(x, ((0, chunk), (0, 0), (0, 0), (0, 0)))
  mask = jnp.pad(mask, ((0, chunk), (0, 0), (0, 0)))
  if reset is not None:
    reset = jnp.pad(reset, ((0, chunk), (0, 0), (0, 0)))

  def run_chunk(k, carry):
    state, out = carry
    start = k * chunk
    xs = jax.lax.dynamic_slice_in_dim(x, start, chunk)  # [C, D, B, I]
    # one dot batched over the directions: XLA:CPU runs it several times faster than a 2-D dot per direction
    # (`input_gates`' form, right for training's thousands of rows) at these few rows
    gx = jax.lax.dot_general(jnp.transpose(xs, (1, 0, 2, 3)).reshape(d, chunk * b, in_dim).astype(dtype), w_x,
                             (((2,), (1,)), ((0,), (0,))), preferred_element_type=jnp.float32)
    gx = jnp.transpose(gx.reshape(d, chunk, b, -1), (1, 0, 2, 3))  # [C, D, B, 4H]
    gx = gx + weights.bias[None, :, None] if wide else gx.astype(dtype)
    ms = jax.lax.dynamic_slice_in_dim(mask, start, chunk)
    rs = None if reset is None else jax.lax.dynamic_slice_in_dim(reset, start, chunk)

    def body(t, carry):
      state, ys = carry
      state, y = step(state, (gx[t], ms[t]) if rs is None else (gx[t], ms[t], rs[t]))
      return state, ys.at[t].set(y)

    ys = jnp.zeros((chunk, d, b, proj), jnp.float32)
    state, ys = jax.lax.fori_loop(0, jnp.minimum(chunk, n_steps - start), body, (state, ys))
    return state, jax.lax.dynamic_update_slice_in_dim(out, ys, start, 0)

  out = jnp.zeros((time + chunk, d, b, proj), jnp.float32)
  final, out = jax.lax.fori_loop(0, (n_steps + chunk - 1) // chunk, run_chunk, ((c0, h0), out))
  return out[:time], final
