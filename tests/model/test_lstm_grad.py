"""The hand-written backward passes of `lstm.lstm_scan` and `lstm.input_gates` against autodiff of plain code."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model import lstm as lstm_mod
from plain_lstm import plain_lstm_scan

T, D, B, H, P, I = 6, 2, 3, 5, 4, 7


_plain_scan = plain_lstm_scan  # cell_clip, proj_clip positional, as the tests call it


def _inputs(seed):
  r = np.random.default_rng(seed)
  n = lambda *s, scale=1.0: jnp.asarray(r.normal(0, scale, s).astype(np.float32))
  mask = np.ones((T, D, B), bool)
  mask[4:, 0, 1] = False  # trailing padding in one row
  mask[2, 1, 2] = False  # and a hole (arbitrary masks keep the state through padded steps)
  mask[:, 1, 0] = False  # an empty row
  # large weights and gates so that both clips bind on many, but not all, steps
  return (n(T, D, B, 4 * H, scale=2.0), n(D, P, 4 * H), n(D, H, P, scale=1.5), jnp.asarray(mask),
          n(D, B, H, scale=0.5), n(D, B, P, scale=0.5))


def _loss(fn, args, cot):
  y, (c, h) = fn(*args)
  return jnp.sum(y * cot[0]) + jnp.sum(c * cot[1]) + jnp.sum(h * cot[2])


@pytest.mark.parametrize("clips", [(None, None), (0.7, 0.3), (1.0, None), (None, 0.5)])
def test_lstm_scan_grad_matches_autodiff(clips):
  gx, w_h, w_p, mask, c0, h0 = _inputs(0)
  r = np.random.default_rng(1)
  cot = (r.normal(size=(T, D, B, P)), r.normal(size=(D, B, H)), r.normal(size=(D, B, P)))
  cot = tuple(jnp.asarray(x.astype(np.float32)) for x in cot)
  ours = lambda gx, w_h, w_p, c0, h0: _loss(
      lambda *a: lstm_mod.lstm_scan(*a[:3], mask, *a[3:], *clips), (gx, w_h, w_p, c0, h0), cot)
  ref = lambda gx, w_h, w_p, c0, h0: _loss(
      lambda *a: _plain_scan(*a[:3], mask, *a[3:], *clips), (gx, w_h, w_p, c0, h0), cot)
  args = (gx, w_h, w_p, c0, h0)
  np.testing.assert_allclose(jax.jit(ours)(*args), jax.jit(ref)(*args), rtol=1e-6)
  g_ours = jax.jit(jax.grad(ours, argnums=range(5)))(*args)
  g_ref = jax.jit(jax.grad(ref, argnums=range(5)))(*args)
  for name, a, b in zip(("gx", "w_h", "w_p", "c0", "h0"), g_ours, g_ref):
    scale = float(jnp.max(jnp.abs(b)))
    assert scale > 0, name
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-6 * scale, name
  for k, clip in enumerate(clips):  # each clip really binds somewhere (else its mask code went untested)
    if clip:
      unclipped = clips[:k] + (None,) + clips[k + 1:]
      y, _ = _plain_scan(gx, w_h, w_p, mask, c0, h0, *clips)
      y2, _ = _plain_scan(gx, w_h, w_p, mask, c0, h0, *unclipped)
      assert float(jnp.max(jnp.abs(y - y2))) > 1e-3


def test_input_gates_grad_matches_autodiff():
  r = np.random.default_rng(2)
  x = jnp.asarray(r.normal(size=(D, B, T, I)).astype(np.float32))
  w = jnp.asarray(r.normal(size=(D, I, 4 * H)).astype(np.float32))
  bias = jnp.asarray(r.normal(size=(D, 4 * H)).astype(np.float32))
  cot = jnp.asarray(r.normal(size=(T, D, B, 4 * H)).astype(np.float32))
  plain = lambda x, w, b: jnp.sum(cot * (jnp.einsum("dbti,dig->tdbg", x, w) + b[None, :, None]))
  ours = lambda x, w, b: jnp.sum(cot * lstm_mod.input_gates(x, w, b))
  for a, b in zip(jax.grad(ours, argnums=(0, 1, 2))(x, w, bias), jax.grad(plain, argnums=(0, 1, 2))(x, w, bias)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))
