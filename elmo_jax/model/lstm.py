"""Stacked LSTMs with projection (TF1 `LSTMCell(num_proj=...)`), both directions in one `lax.scan`.

Exactly bilm-tf's cell: gates from [x; h_prev] @ W_0 + B in TF order (i, j, f, o), +1.0 on the forget gate
(TF's forget_bias, not stored in the weight file; `config.implicit_forget_bias=False` for AllenNLP's cell, whose
bias holds it), cell clip, h = clip(sigmoid(o) * tanh(c) @ W_P_0),
no peepholes. Padded steps leave (c, h) unchanged and output zeros, like `dynamic_rnn(sequence_length=...)`.

Speed: the input half of the gate matmul runs for all time steps at once outside the scan (`input_gates`);
the scan only does the recurrent `h @ W_h`, with the forward and backward directions batched into one
einsum. Both have hand-written backward passes (custom_vjp): the weight gradients are single large matmuls
after the loop instead of per-step accumulations, and no 4H-wide array is transposed
(`benchmarks/train_throughput.py` compares them with autodiff through `lax.scan`; unrolling the scan did
not help on CPU, hence config.scan_unroll = 1).

With a bfloat16 matmul dtype the two [T, D, B, 4H] arrays the scans trade with the hoisted projection are
bf16 too: x @ W_x leaves `input_gates` rounded (the bias is added in float32 inside the step instead) and the
backward scan emits its gate gradients rounded (their consumers, the dW_x, dx and dW_h matmuls, read bf16
anyway; the bias gradient is summed from the float32 values in the loop, and the clip masks come from the
float32 state as before). The bf16 path also keeps them as one [T, B, 4H] array per direction
(`input_gates_split`): the backward pass's per-direction matmuls then read the scan's output as it is, where
one [T, D, B, 4H] array made XLA:TPU copy it to a direction-major layout and slice it (4 passes over it per
layer). The two per-step arrays each scan writes (saved activations, gate gradients) take the form each
compiler fuses best (`recurrence.py`), and every scan writes its stacked outputs into buffers it never
zero-fills (`recurrence.scan_into_buffers`). The float32 path gives the same numbers as before, bit for bit
(tests/model/test_lstm_bf16.py).
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.dropout import Dropout, Rows
from elmo_jax.model.lstm_step import StepWeights, cell_update, lstm_steps, stack_layer, step_fn
from elmo_jax.model.recurrence import rounded_gate_grads, scan_into_buffers

Dtype = Any
FORGET_BIAS = 1.0
# (c [n_layers, 2, batch, hidden], h [n_layers, 2, batch, projection]); direction 0 = forward.
LSTMState = tuple[jax.Array, jax.Array]


def zero_state(config: BiLMConfig, batch_size: int, xp: Any = jnp) -> LSTMState:
  """The all-zero LSTMState of `batch_size` rows; `xp=np` gives writable host arrays."""
  return (xp.zeros((config.n_layers, 2, batch_size, config.lstm_dim), xp.float32),
          xp.zeros((config.n_layers, 2, batch_size, config.projection_dim), xp.float32))


class LSTMWeights(nn.Module):
  """One direction of one layer; names match the hdf5 datasets `.../LSTMCell/{W_0,B,W_P_0}`."""
  input_dim: int
  hidden_dim: int
  projection_dim: int

  @nn.compact
  def __call__(self) -> tuple[jax.Array, jax.Array, jax.Array]:
    glorot = nn.initializers.glorot_uniform()  # TF1 get_variable's default
    w = self.param("W_0", glorot, (self.input_dim + self.projection_dim, 4 * self.hidden_dim))
    b = self.param("B", nn.initializers.zeros, (4 * self.hidden_dim,))
    w_p = self.param("W_P_0", glorot, (self.hidden_dim, self.projection_dim))
    return w, b, w_p


def lstm_scan(gx, w_h, w_p, mask, c0, h0, cell_clip=None, proj_clip=None, dtype=jnp.float32, unroll=1, bias=None):
  """Runs the recurrence for D directions at once.

  Args:
    gx: [T, D, B, 4H] input contribution x @ W_x + B + forget bias, float32; with `bias`, x @ W_x alone in
      the matmul dtype (`input_gates(..., bias=None)`), or a tuple of D such arrays [T, B, 4H], one per
      direction (`input_gates_split`), whose gradient is then a tuple too.
    w_h: [D, P, 4H] recurrent weights; w_p: [D, H, P] projection.
    mask: [T, D, B] bool, False on padded steps.
    c0: [D, B, H]; h0: [D, B, P] initial state.
    bias: None, or [D, 4H] float32 (B + forget bias), added to the gates in float32 inside the step; its
      gradient is summed in float32 in the backward scan, whose gate gradients (the cotangent of gx) are
      then emitted in `dtype`: with bfloat16, half the bytes of both [T, D, B, 4H] arrays.
  Returns:
    outputs [T, D, B, P] (0 on padded steps) and the final (c, h).
  """
  if isinstance(gx, list):
    gx = tuple(gx)
  return _lstm_scan(gx, w_h, w_p, mask, c0, h0, bias, cell_clip or None, proj_clip or None, dtype, int(unroll))


def _forward(gx, w_h, w_p, mask, c0, h0, bias, cell_clip, proj_clip, dtype, unroll, save):
  """The recurrence; with `save`, also the per-step values the hand-written backward pass needs."""
  step = step_fn(w_h.astype(dtype), w_p.astype(dtype), cell_clip, proj_clip, dtype, save, gx_bias=bias)
  return scan_into_buffers(step, (c0, h0), (gx, mask), mask.shape[0], unroll=unroll)


# Hand-written backward pass. Autodiff of `lax.scan` accumulates the weight gradients in the loop carry, i.e.
# two small matmuls per step ([P, B] x [B, 4H] and [H, B] x [B, P]) plus the carry traffic; here the reverse
# scan only propagates (dc, dh) and emits the per-step gate/projection gradients, and dW_h, dW_P are each one
# large matmul over all T * B rows after the loop (what cuDNN does too).
@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _lstm_scan(gx, w_h, w_p, mask, c0, h0, bias, cell_clip, proj_clip, dtype, unroll):
  final, outputs = _forward(gx, w_h, w_p, mask, c0, h0, bias, cell_clip, proj_clip, dtype, unroll, save=False)
  return outputs, final


def _lstm_scan_fwd(gx, w_h, w_p, mask, c0, h0, bias, cell_clip, proj_clip, dtype, unroll):
  final, (outputs, saved) = _forward(gx, w_h, w_p, mask, c0, h0, bias, cell_clip, proj_clip, dtype, unroll,
                                     save=True)
  split = None if not isinstance(gx, tuple) else jnp.zeros((len(gx), 0), jnp.int8)  # its shape says D
  return (outputs, final), (w_h, w_p, mask, saved, final[1], bias, split)


def _lstm_scan_bwd(cell_clip, proj_clip, dtype, unroll, res, cts):
  w_h, w_p, mask, saved, h_last, bias, split = res
  d_out, (d_c, d_h) = cts
  w_h_c, w_p_c = w_h.astype(dtype), w_p.astype(dtype)

  def step(carry, inputs):
    dc, dh, h_after = carry  # h_after: the projected output after this step (clipped), for the clip's gradient
    r, dy, m = inputs
    si, tj, sf, so = jnp.split(r.gates.astype(jnp.float32), 4, axis=-1)
    tc = r.tc.astype(jnp.float32)
    c_raw, _ = cell_update(si, tj, sf, r.c_prev, cell_clip)
    keep = m[..., None]
    dh_new = jnp.where(keep, dh + dy, 0.0)
    if proj_clip:  # jnp.clip's gradient: 0 outside the open interval (|clip(x)| < c iff -c < x < c)
      dh_new = jnp.where(jnp.abs(h_after) < proj_clip, dh_new, 0.0)
    dm = jnp.einsum("dbp,dhp->dbh", dh_new.astype(dtype), w_p_c, preferred_element_type=jnp.float32)
    dc_new = jnp.where(keep, dc, 0.0) + dm * so * (1.0 - tc * tc)
    if cell_clip:
      dc_new = jnp.where((c_raw > -cell_clip) & (c_raw < cell_clip), dc_new, 0.0)
    parts = [dc_new * tj * si * (1.0 - si), dc_new * si * (1.0 - tj * tj),
             dc_new * r.c_prev * sf * (1.0 - sf), dm * tc * so * (1.0 - so)]
    if bias is None:  # float32 gate gradients, as always
      dg, d_bias = jnp.concatenate(parts, axis=-1), None
    else:  # rounded, with this step's bias gradient [D, 4H] summed from the float32 values
      dg, d_bias = rounded_gate_grads(parts, dtype)
    dh_prev = jnp.einsum("dbg,dpg->dbp", dg.astype(dtype), w_h_c, preferred_element_type=jnp.float32)
    dh_prev = dh_prev + jnp.where(keep, 0.0, dh)
    dc_prev = dc_new * sf + jnp.where(keep, 0.0, dc)
    if split is not None:  # one output per direction: gx's own structure
      dg = tuple(dg[k] for k in range(split.shape[0]))
    return (dc_prev, dh_prev, r.h_prev), (dg, dh_new, d_bias)

  (dc0, dh0, _), (dgx, dh_raw, d_bias) = scan_into_buffers(step, (d_c, d_h, h_last), (saved, d_out, mask),
                                                           mask.shape[0], reverse=True, unroll=unroll)
  d_bias = None if bias is None else jnp.sum(d_bias, axis=0)
  if split is None:
    dw_h = jnp.einsum("tdbp,tdbg->dpg", saved.h_prev.astype(dtype), dgx.astype(dtype),
                      preferred_element_type=jnp.float32)
  else:
    dw_h = jnp.stack([jnp.einsum("tbp,tbg->pg", saved.h_prev[:, k].astype(dtype), dg_k.astype(dtype),
                                 preferred_element_type=jnp.float32) for k, dg_k in enumerate(dgx)])
  # The projection's inputs of every step, sigmoid(o) * tanh(c), recomputed at once (one elementwise pass).
  m_new = saved.gates[..., 3 * saved.tc.shape[-1]:].astype(jnp.float32) * saved.tc.astype(jnp.float32)
  dw_p = jnp.einsum("tdbh,tdbp->dhp", m_new.astype(dtype), dh_raw.astype(dtype),
                    preferred_element_type=jnp.float32)
  return dgx, dw_h.astype(w_h.dtype), dw_p.astype(w_p.dtype), None, dc0, dh0, d_bias


_lstm_scan.defvjp(_lstm_scan_fwd, _lstm_scan_bwd)


@jax.custom_vjp
def input_gates(x: jax.Array, w_x: jax.Array, bias: jax.Array | None) -> jax.Array:
  """Input half of the gates for all steps: x [D, B, T, I] @ w_x [D, I, 4H] + bias [D, 4H] -> [T, D, B, 4H] f32.

  With bias None: x @ w_x alone, rounded to x's dtype (the bfloat16 path: `lstm_scan(..., bias=)` adds the
  bias in float32 inside the step, so this [T, D, B, 4H] array and its gradient are half the bytes).

  One 2-D dot per direction over the time-major rows of a transposed x (only I wide), written into
  lstm_scan's layout; the backward pass is written out the same way (dW = x^T dG with the small x^T
  materialized). Left to autodiff, the batch-major einsum + transpose made XLA:CPU transpose the 4H-wide
  gate arrays element by element, forward and backward.
  """
  xt = jnp.transpose(x, (0, 2, 1, 3))  # [D, T, B, I]
  d, t, b, i = xt.shape
  if bias is None:
    return jnp.stack([jnp.dot(xt[k].reshape(t * b, i), w_x[k], preferred_element_type=jnp.float32)
                      .astype(x.dtype).reshape(t, b, -1) for k in range(d)], axis=1)
  return jnp.stack([(jnp.dot(xt[k].reshape(t * b, i), w_x[k], preferred_element_type=jnp.float32) + bias[k])
                    .reshape(t, b, -1) for k in range(d)], axis=1)


def _input_gates_fwd(x, w_x, bias):
  return input_gates(x, w_x, bias), (x, w_x, bias)


def _input_gates_bwd(res, dg):
  x, w_x, bias = res
  dbias = None if bias is None else jnp.sum(dg, axis=(0, 2))
  dg = dg.astype(x.dtype)
  dx, dw = _input_gates_grads(x, w_x, [dg[:, k] for k in range(x.shape[0])])
  return dx, dw, dbias


def _input_gates_grads(x, w_x, dgs):
  """(dx [D, B, T, I], dW_x [D, I, 4H]) from the per-direction gate gradients dgs[k] [T, B, 4H] (x's dtype)."""
  d, b, t, i = x.shape
  xt = jnp.transpose(x, (0, 3, 2, 1)).reshape(d, i, t * b)  # [D, I, T*B]: rows in (t, b) order
  dw = jnp.stack([jnp.dot(xt[k], dgs[k].reshape(t * b, -1), preferred_element_type=jnp.float32)
                  for k in range(d)])
  dx = jnp.stack([jnp.dot(dgs[k].reshape(t * b, -1), w_x[k].T, preferred_element_type=jnp.float32)
                  .reshape(t, b, i) for k in range(d)])  # [D, T, B, I]
  return jnp.transpose(dx, (0, 2, 1, 3)).astype(x.dtype), dw.astype(w_x.dtype)


input_gates.defvjp(_input_gates_fwd, _input_gates_bwd)


@jax.custom_vjp
def input_gates_split(x: jax.Array, w_x: jax.Array) -> tuple[jax.Array, ...]:
  """`input_gates(x, w_x, None)` as one array per direction: x [D, B, T, I] @ w_x [D, I, 4H] -> D arrays
  [T, B, 4H] in x's dtype (`lstm_scan`'s split `gx`), each straight from its direction's dot."""
  xt = jnp.transpose(x, (0, 2, 1, 3))  # [D, T, B, I]
  d, t, b, i = xt.shape
  return tuple(jnp.dot(xt[k].reshape(t * b, i), w_x[k], preferred_element_type=jnp.float32)
               .astype(x.dtype).reshape(t, b, -1) for k in range(d))


def _input_gates_split_fwd(x, w_x):
  return input_gates_split(x, w_x), (x, w_x)


def _input_gates_split_bwd(res, dgs):
  x, w_x = res
  return _input_gates_grads(x, w_x, [dg.astype(x.dtype) for dg in dgs])


input_gates_split.defvjp(_input_gates_split_fwd, _input_gates_split_bwd)


class BiLSTMStack(nn.Module):
  """Separate forward and backward LSTM stacks, run together.

  Attributes:
    config: the biLM shape; this module reads `n_layers`, `lstm_dim`, `projection_dim`, `cell_clip`,
      `proj_clip` and `use_skip_connections` (residual connection on every layer but the first, bilm-tf's
      ResidualWrapper).
    dropout_rate: dropout on each layer's input while training (bilm-tf's DropoutWrapper).
    dtype: matmul dtype; the cell state and gates stay float32.
    unroll: `lax.scan` unroll factor.
  """
  config: BiLMConfig
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  unroll: int = 1

  @nn.compact
  def __call__(self, fwd_x: jax.Array, bwd_x: jax.Array, fwd_mask: jax.Array, bwd_mask: jax.Array,
               state: LSTMState | None = None, deterministic: bool = True, n_steps: jax.Array | None = None,
               rows: Rows = None, weights: Sequence[StepWeights] | None = None,
               resets: tuple[jax.Array, jax.Array] | None = None):
    """Runs both stacks, each over its own reading order.

    Args:
      fwd_x, bwd_x: [batch, time, P] inputs; the backward ones already reversed (reading order).
      fwd_mask, bwd_mask: [batch, time] bool.
      state: initial LSTMState or None for zeros.
      n_steps: optional int scalar, all steps from it on are padding: skipped (inference, `lstm_steps`).
      weights: with `n_steps`, every layer's `StepWeights` made ahead (`stacked_weights` of these params),
        else they are made from the params in the call.
      rows: where these batch rows sit in the global batch (a data-parallel shard): dropout draws the
        global batch's masks (`dropout.Dropout`).
      resets: with `n_steps`, (forward, backward) [batch, time] bool in each reading order: the steps where a
        sentence starts, whose state is zeros (rows packed with several sentences end to end, `lstm_steps`).
    Returns:
      outputs [n_layers, 2, batch, time, P] in reading order, and the final LSTMState.
    """
    cfg = self.config
    hidden = cfg.lstm_dim
    c0, h0 = zero_state(cfg, fwd_x.shape[0]) if state is None else state
    x = jnp.stack([fwd_x, bwd_x]).astype(jnp.float32)  # [2, B, T, P]
    mask = jnp.stack([fwd_mask, bwd_mask]).astype(bool)  # [2, B, T]
    mask_t = jnp.transpose(mask, (2, 0, 1))  # [T, 2, B]
    if resets is not None and n_steps is None:
      raise ValueError("resets (packed rows) are an inference form: they need n_steps")
    reset_t = None if resets is None else jnp.transpose(jnp.stack(resets).astype(bool), (2, 0, 1))  # [T, 2, B]
    forget = forget_gate_bias(cfg)
    outputs, cs, hs = [], [], []
    for k in range(cfg.n_layers):
      in_dim = x.shape[-1]
      layer = stack_layer(*[LSTMWeights(in_dim, hidden, cfg.projection_dim, name=f"{d}_layer_{k}")()
                            for d in ("forward", "backward")], forget)
      inp = x
      if self.dropout_rate > 0.0:
        inp = Dropout(self.dropout_rate)(inp, deterministic, rows, batch_axis=1)
      if n_steps is None:
        # float32: the bias in the hoisted projection (float32 gates, as always); a narrower matmul dtype: the
        # projection in that dtype and the bias added in float32 in the step (lstm_scan's `bias`)
        wide = jnp.dtype(self.dtype) == jnp.float32
        if wide:  # float32 calls lstm_scan as it always has
          gx = input_gates(inp.astype(self.dtype), layer.w_x.astype(self.dtype), layer.bias)
        else:  # one [T, B, 4H] array per direction
          gx = input_gates_split(inp.astype(self.dtype), layer.w_x.astype(self.dtype))
        extra = {} if wide else {"bias": layer.bias}
        out, (c, h) = lstm_scan(gx, layer.w_h, layer.w_p, mask_t, c0[k], h0[k], cfg.cell_clip, cfg.proj_clip,
                                self.dtype, self.unroll, **extra)
      else:  # the layer's weights made ahead where given (the same values, not copied in this call)
        out, (c, h) = lstm_steps(jnp.transpose(inp, (2, 0, 1, 3)), layer if weights is None else weights[k], mask_t,
                                 c0[k], h0[k], n_steps, cfg.cell_clip, cfg.proj_clip, self.dtype, reset_t)
      out = jnp.transpose(out, (1, 2, 0, 3))  # [2, B, T, P]
      if cfg.use_skip_connections and k > 0:
        out = out + jnp.where(mask[..., None], inp, 0.0)
      outputs.append(out)
      cs.append(c)
      hs.append(h)
      x = out
    return jnp.stack(outputs), (jnp.stack(cs), jnp.stack(hs))


def forget_gate_bias(config: BiLMConfig) -> jax.Array:
  """[4H]: FORGET_BIAS on the forget gate's quarter where the cell adds it (bilm-tf's), else zeros."""
  hidden = config.lstm_dim
  forget_bias = FORGET_BIAS if config.implicit_forget_bias else 0.0
  return jnp.zeros((4 * hidden,), jnp.float32).at[2 * hidden:3 * hidden].set(forget_bias)


def stacked_weights(lstm_params: Any, config: BiLMConfig) -> tuple[StepWeights, ...]:
  """Every layer's `StepWeights` from a biLM's `params["lstm"]`: made once, they spare each inference call the
  copy that stacking the directions and splitting W_0 costs (`BiLSTMStack(weights=...)`; 268 MB a layer in the
  `original` preset)."""
  forget = forget_gate_bias(config)
  def cell(name):
    return tuple(lstm_params[name][n] for n in ("W_0", "B", "W_P_0"))
  return tuple(stack_layer(cell(f"forward_layer_{k}"), cell(f"backward_layer_{k}"), forget)
               for k in range(config.n_layers))
