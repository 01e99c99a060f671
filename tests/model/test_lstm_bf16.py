"""The LSTM stack's bfloat16 path (bf16 input projections and gate gradients, lstm.py) against float32, and the
float32 path pinned bit for bit to its values before that change."""
from __future__ import annotations

import hashlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.model import BiLMConfig, BiLSTMStack
from elmo_jax.model import lstm as lstm_mod
from elmo_jax.model import recurrence
from elmo_jax.runtime import compat
import launch_util
from plain_lstm import plain_lstm_scan
import tiny

B, T = 3, 7


def _setup():
  cfg = BiLMConfig.from_options(tiny.tiny_options())
  r = np.random.default_rng(0)
  x = r.normal(size=(2, B, T, cfg.projection_dim)).astype(np.float32)
  mask = np.ones((2, B, T), bool)
  mask[0, 1, 5:] = False  # trailing padding
  mask[1, 2, :] = False  # an empty row
  cot = r.normal(size=(cfg.n_layers, 2, B, T, cfg.projection_dim)).astype(np.float32)
  return cfg, jnp.asarray(x), jnp.asarray(mask), jnp.asarray(cot)


def _grads(dtype):
  """(loss, {param path or 'x': gradient}) of a fixed linear loss of the tiny stack's outputs and state."""
  cfg, x, mask, cot = _setup()
  module = BiLSTMStack(cfg, dtype=dtype)
  params = jax.jit(module.init)(jax.random.PRNGKey(0), x[0], x[1], mask[0], mask[1])["params"]  # one compile
  # larger weights so that the cell and projection clips (3.0) bind on some steps
  params = jax.tree_util.tree_map(lambda p: 3.0 * p + 0.1, params)

  def loss(params, x):
    out, (c, h) = module.apply({"params": params}, x[0], x[1], mask[0], mask[1])
    return jnp.sum(out * cot) + 0.5 * jnp.sum(c) - 0.25 * jnp.sum(h)

  value, (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
  flat = {"/".join(k.key for k in path): np.asarray(v) for path, v in jax.tree_util.tree_leaves_with_path(g_params)}
  return float(value), {**flat, "x": np.asarray(g_x)}


def _digest(loss, grads):
  h = hashlib.sha256(np.float32(loss).tobytes())
  for k in sorted(grads):
    h.update(k.encode() + grads[k].astype(np.float32).tobytes())
  return h.hexdigest()


# sha256 of (loss, every gradient) of `_grads(float32)`, the bits of the float32 program that the bf16 path
# leaves unchanged, per jaxlib version and code generation of XLA:CPU: the tests' (launch_util.TEST_CODEGEN_FLAGS:
# "tests" where XLA still has the classic emitters, else "opt0"), backend optimization level 0 alone ("opt0"), and
# the product's full optimization ("full", ELMO_JAX_TEST_FULL_OPT=1). The bits also depend on the CPU's vector
# instructions: each entry lists those measured (0.10.2's first: main at commit cdb5b3d; the others: an AVX2 AMD
# EPYC). Elsewhere the test checks that two separate compiles give the same bits.
FLOAT32_DIGEST = {
    "0.10.2": {"tests": {"dd7d4d9cf92ae0a6e625e4882670b7e3c66ed280837885a9a55c916560d8bf0a",
                         "70157da4e730ce1e8cace9cdf0f9993457281af23e2f3849249c59b9aa44407e"},
               "opt0": {"c60eb3650691e2282801bb5dd501c8ce6e0c4699853f0fbe717f4d480f7284c0",
                        "1c63c424b95f1fb9f0566a3cdd11b9d7b2046000ff047ad1007de596c0235a89"},
               "full": {"48ee9e3f0f04c24934df59c098d7b06bddc78dd9a1a4018227d27df12905bee7",
                        "52ed078476b5270f94fb10ee38c76308c2a5fdf8a5fe8f7c8c469d5e6dc845e9"}},
    "0.11.2": {"opt0": {"1c63c424b95f1fb9f0566a3cdd11b9d7b2046000ff047ad1007de596c0235a89"},
               "full": {"52ed078476b5270f94fb10ee38c76308c2a5fdf8a5fe8f7c8c469d5e6dc845e9"}},
    "0.12.0.1": {"opt0": {"0ea66c7e8303df105a18cd9ba348e98d97ea78b0e97e13bfd065389e52f19281"},
                 "full": {"bd923ca965dc4d99a98c5bd3296636cf58dc6f0c77da9bf9184d1c04b14b4928"}},
}


def test_float32_step_bit_identical_to_before():
  """The float32 step's bits as pinned for this jaxlib and code generation; where the machine gives other bits
  (another CPU, an unpinned jaxlib), the same bits from a second, separate compile (no compilation cache)."""
  digest = _digest(*_grads(jnp.float32))
  flags = os.environ.get("XLA_FLAGS", "").split()
  level = "full" if launch_util.OPT_LEVEL_0 not in flags else (
      "tests" if launch_util.CLASSIC_EMITTERS in flags else "opt0")
  if digest in FLOAT32_DIGEST.get(compat.jaxlib_version(), {}).get(level, ()):
    return
  jax.clear_caches()
  was = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    again = _grads(jnp.float32)
  finally:
    jax.config.update("jax_enable_compilation_cache", was)
  assert _digest(*again) == digest, (compat.jaxlib_version(), level, again[0])


def test_bfloat16_gradients_match_float32():
  """bf16 matmuls, input projections and gate gradients (float32 cell state, bias and its gradient): every
  gradient within 5% of float32 (relative L2 norm; bf16 rounds at 2^-9 relative, through 7 steps x 2 layers
  with clips binding). Measured: at most 2.8% (x's gradient 2.8%, W_0's 2.6%); before the input projection
  was rounded to bf16, at most 2.1%."""
  loss32, g32 = _grads(jnp.float32)
  loss16, g16 = _grads(jnp.bfloat16)
  assert abs(loss16 - loss32) <= 0.01 * abs(loss32), (loss16, loss32)
  errors = {k: float(np.linalg.norm(g16[k] - g32[k]) / np.linalg.norm(g32[k])) for k in g32}
  print(errors)
  assert set(g16) == set(g32) and all(g16[k].dtype == np.float32 for k in g16)
  assert max(errors.values()) < 0.05, errors
  assert min(errors.values()) > 0, errors  # the bf16 path really ran in bf16


def test_separate_bias_path_matches_autodiff_in_float32():
  """`lstm_scan(..., bias=)` (the bias added in the step, its gradient summed in the backward scan), run in
  float32 so that only the arithmetic can differ: value and every gradient equal autodiff of the plain scan
  of gx + bias (1e-5 of each gradient's scale), with both clips binding."""
  r = np.random.default_rng(3)
  t, d, b, h, p = 6, 2, 3, 5, 4
  n = lambda *s, scale=1.0: jnp.asarray(r.normal(0, scale, s).astype(np.float32))
  gx, bias, w_h, w_p = n(t, d, b, 4 * h, scale=2.0), n(d, 4 * h), n(d, p, 4 * h), n(d, h, p, scale=1.5)
  c0, h0, cot = n(d, b, h, scale=0.5), n(d, b, p, scale=0.5), n(t, d, b, p)
  mask = np.ones((t, d, b), bool)
  mask[4:, 0, 1] = False
  mask = jnp.asarray(mask)
  clips = (0.7, 0.3)

  def ours(gx, bias, w_h, w_p, c0, h0):
    y, (c, hh) = lstm_mod.lstm_scan(gx, w_h, w_p, mask, c0, h0, *clips, bias=bias)
    return jnp.sum(y * cot) + jnp.sum(c) - jnp.sum(hh)

  def ref(gx, bias, w_h, w_p, c0, h0):
    y, (c, hh) = plain_lstm_scan(gx + bias[:, None], w_h, w_p, mask, c0, h0, *clips)
    return jnp.sum(y * cot) + jnp.sum(c) - jnp.sum(hh)

  args = (gx, bias, w_h, w_p, c0, h0)
  np.testing.assert_allclose(jax.jit(ours)(*args), jax.jit(ref)(*args), rtol=1e-5)
  for name, a, e in zip(("gx", "bias", "w_h", "w_p", "c0", "h0"), jax.jit(jax.grad(ours, argnums=range(6)))(*args),
                        jax.jit(jax.grad(ref, argnums=range(6)))(*args)):
    scale = float(jnp.max(jnp.abs(e)))
    assert scale > 0 and float(jnp.max(jnp.abs(a - e))) <= 1e-5 * scale, name


@pytest.mark.slow  # a rerun in a process of its own (the product's code generation)
def test_per_direction_gates_equal_the_stacked_form_in_bfloat16(request):
  """The bf16 stack's per-direction input projections (`input_gates_split`, a tuple `gx`) give the same loss and
  the same gradients, to the bit on CPU under the product's fusion emitters, as the one [T, D, B, 4H] array
  (`input_gates(..., None)`) they replace."""
  if launch_util.rerun_under_product_codegen(request):
    return
  r = np.random.default_rng(5)
  d, b, t, i, h, p = 2, 3, 6, 5, 8, 4
  n = lambda *s, scale=1.0: jnp.asarray(r.normal(0, scale, s).astype(np.float32))
  x, w_x, w_h, w_p, bias = n(d, b, t, i), n(d, i, 4 * h, scale=0.5), n(d, p, 4 * h), n(d, h, p, scale=1.5), n(d, 4 * h)
  mask = np.ones((t, d, b), bool)
  mask[4:, 0, 1] = False
  mask = jnp.asarray(mask)
  zeros = jnp.zeros((d, b, h)), jnp.zeros((d, b, p))

  def loss(split, x, w_x, w_h, w_p, bias):
    xb, wb = x.astype(jnp.bfloat16), w_x.astype(jnp.bfloat16)
    gx = lstm_mod.input_gates_split(xb, wb) if split else lstm_mod.input_gates(xb, wb, None)
    if split:
      assert isinstance(gx, tuple) and len(gx) == d and gx[0].shape == (t, b, 4 * h)
    y, (c, hh) = lstm_mod.lstm_scan(gx, w_h, w_p, mask, *zeros, 0.7, 0.3, jnp.bfloat16, bias=bias)
    return jnp.sum(y ** 2) + jnp.sum(c) - jnp.sum(hh)

  args = (x, w_x, w_h, w_p, bias)
  (v0, g0), (v1, g1) = (jax.jit(jax.value_and_grad(lambda *a, s=s: loss(s, *a), argnums=range(5)))(*args)
                        for s in (False, True))
  assert float(v0) == float(v1)
  for a, e in zip(g1, g0):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32))


def test_tpu_and_gpu_forms_of_the_bfloat16_step_arrays_agree():
  """The bf16 step writes its saved activations and its rounded gate gradients in one of two forms, chosen by
  the compiler platform (`lax.platform_dependent`: concatenates on TPU and CPU, one elementwise select on GPU).
  Both give the same bits, and the bias sums (another order of additions) agree to float32 rounding."""
  r = np.random.default_rng(7)
  d, b, h = 2, 5, 8
  g = jnp.asarray(r.normal(0, 2.0, (d, b, 4 * h)).astype(np.float32))
  i, j, f, o = jnp.split(g, 4, axis=-1)
  acts = (jax.nn.sigmoid(i), jnp.tanh(j), jax.nn.sigmoid(f), jax.nn.sigmoid(o))
  saved = [jax.jit(form, static_argnames="dtype")(g, *acts, dtype=jnp.bfloat16)
           for form in (recurrence.saved_gates_concatenated, recurrence.saved_gates_elementwise)]
  assert saved[0].dtype == jnp.bfloat16 and saved[0].shape == (d, b, 4 * h)
  np.testing.assert_array_equal(np.asarray(saved[0], np.float32), np.asarray(saved[1], np.float32))

  parts = [jnp.asarray(r.normal(0, 1.0, (d, b, h)).astype(np.float32)) for _ in range(4)]
  (dg0, sum0), (dg1, sum1) = (jax.jit(form, static_argnames="dtype")(parts, dtype=jnp.bfloat16)
                              for form in (recurrence.gate_grads_per_gate, recurrence.gate_grads_elementwise))
  expected = np.concatenate([np.asarray(p) for p in parts], axis=-1)
  assert dg0.dtype == dg1.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(dg0, np.float32), np.asarray(dg1, np.float32))
  np.testing.assert_array_equal(np.asarray(dg0, np.float32),
                                np.asarray(jnp.asarray(expected).astype(jnp.bfloat16), np.float32))
  assert sum0.dtype == sum1.dtype == jnp.float32  # summed before rounding: within float32 rounding of the sum
  np.testing.assert_allclose(np.asarray(sum0), expected.sum(axis=1), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(sum1), expected.sum(axis=1), rtol=1e-6, atol=1e-6)
