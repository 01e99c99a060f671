"""ScalarMix against hand-worked examples (seed docs 000/001) and AllenNLP's masked layer norm."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.model import ScalarMix

# Seed 001's worked example: two occurrences of "bank", layers h0, h1, h2 (2-d), batch = [river, loan].
LAYERS = jnp.array([[[[1.0, 0.0]], [[0.0, 2.0]], [[3.0, 1.0]]],     # river
                    [[[1.0, 0.0]], [[2.0, 0.0]], [[-1.0, 2.0]]]])   # loan  -> [batch=2, 3, time=1, 2]
LABELS = jnp.array([1.0, 0.0])
HEAD = jnp.array([1.0, -1.0])
LOGITS = np.log([0.2, 0.3, 0.5])


def _params(a=LOGITS, gamma=1.0):
  return {"scalar_parameters": jnp.asarray(a, jnp.float32), "gamma": jnp.asarray(gamma, jnp.float32)}


def _loss(params):
  e = ScalarMix(3).apply({"params": params}, LAYERS)[:, 0]  # [2, 2]
  z = e @ HEAD
  return jnp.mean(optax.sigmoid_binary_cross_entropy(z, LABELS))


def test_worked_example_outputs():
  out = np.asarray(ScalarMix(3).apply({"params": _params()}, LAYERS))
  np.testing.assert_allclose(out[:, 0], [[1.7, 1.1], [0.3, 1.0]], atol=1e-6)
  out = np.asarray(ScalarMix(3).apply({"params": _params(gamma=2.0)}, LAYERS))
  np.testing.assert_allclose(out[:, 0], [[3.4, 2.2], [0.6, 2.0]], atol=1e-6)
  # Also accepts [mixture, ...] layouts.
  flat = jnp.moveaxis(LAYERS[:, :, 0], 1, 0)  # [mixture=3, batch=2, dim=2]
  np.testing.assert_allclose(np.asarray(ScalarMix(3).apply({"params": _params()}, flat)),
                             [[1.7, 1.1], [0.3, 1.0]], atol=1e-6)


def test_worked_example_loss_gradients_and_sgd_step():
  params = _params()
  assert abs(float(_loss(params)) - 0.4203369997) < 1e-6
  g = jax.grad(_loss)(params)
  np.testing.assert_allclose(np.asarray(g["scalar_parameters"]), [0.042234, 0.272578, -0.314812], atol=1e-6)
  assert abs(float(g["gamma"]) - (-0.222437)) < 1e-6
  opt = optax.sgd(0.1)
  updates, _ = opt.update(g, opt.init(params), params)
  new = optax.apply_updates(params, updates)
  assert abs(float(_loss(new)) - 0.3980548517) < 1e-6


def test_seed000_exercise1():
  layers = jnp.array([[[1.0, 1.0]], [[2.0, 2.0]], [[3.0, 3.0]]])[None]  # [1, 3, 1, 2]
  out = np.asarray(ScalarMix(3, initial_scalar_parameters=[1.0, 0.0, 0.0], initial_gamma=2.0).apply(
      {"params": _params([1.0, 0.0, 0.0], 2.0)}, layers))
  exact = 2.0 * (np.e + 5.0) / (np.e + 2.0)  # 2 * (e*1 + 2 + 3) / (e + 2)
  assert abs(exact - 3.27165) < 1e-5
  np.testing.assert_allclose(out[0, 0], [exact, exact], atol=1e-6)


def test_init_values():
  mix = ScalarMix(3, initial_scalar_parameters=[0.5, -1.0, 2.0], initial_gamma=0.7)
  params = mix.init(jax.random.key(0), LAYERS)["params"]
  np.testing.assert_array_equal(np.asarray(params["scalar_parameters"]), np.float32([0.5, -1.0, 2.0]))
  assert float(params["gamma"]) == np.float32(0.7)
  np.testing.assert_array_equal(np.asarray(ScalarMix(3).init(jax.random.key(0), LAYERS)["params"]["scalar_parameters"]), 0.0)


def _allennlp_do_layer_norm(tensor, broadcast_mask, num_elements_not_masked):
  """numpy transcription of allennlp.modules.scalar_mix.ScalarMix._do_layer_norm (float32 tiny = 1e-13)."""
  tensor_masked = tensor * broadcast_mask
  mean = np.sum(tensor_masked) / num_elements_not_masked
  variance = np.sum(((tensor_masked - mean) * broadcast_mask) ** 2) / num_elements_not_masked
  return (tensor - mean) / np.sqrt(variance + 1e-13)


def test_layer_norm_matches_allennlp_masked_semantics():
  rng = np.random.default_rng(0)
  layers = rng.normal(2.0, 3.0, (2, 3, 5, 4))  # [batch, mix, time, dim]
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  layers[0, :, 3:] = 100.0  # masked garbage must not enter the statistics
  a = np.array([0.3, -0.2, 1.0])
  params = _params(a, 1.3)
  out = np.asarray(ScalarMix(3, do_layer_norm=True).apply({"params": params}, jnp.asarray(layers, jnp.float32),
                                                         jnp.asarray(mask)))
  bmask = mask[..., None].astype(np.float64)
  n = mask.sum() * layers.shape[-1]
  s = np.exp(a) / np.exp(a).sum()
  expected = 1.3 * sum(s[k] * _allennlp_do_layer_norm(layers[:, k], bmask, n) for k in range(3))
  np.testing.assert_allclose(out[mask], expected[mask], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-5)  # masked positions too, as AllenNLP
  # Without the mask hiding the garbage, the result would be different.
  wrong = 1.3 * sum(s[k] * _allennlp_do_layer_norm(layers[:, k], 1.0, layers[:, k].size) for k in range(3))
  assert np.max(np.abs(out[mask] - wrong[mask])) > 1e-2


def test_l2_is_sown():
  a = jnp.array([0.5, -1.0, 2.0])
  _, state = ScalarMix(3, l2_coef=0.01).apply({"params": _params(a)}, LAYERS, mutable=["losses"])
  (value,) = state["losses"]["scalar_mix_l2"]
  np.testing.assert_allclose(float(value), 0.01 * (0.25 + 1.0 + 4.0), rtol=1e-6)
  _, state = ScalarMix(3).apply({"params": _params(a)}, LAYERS, mutable=["losses"])
  assert "scalar_mix_l2" not in state.get("losses", {})


def _train(l2_coef, steps=100):
  mix = ScalarMix(3, l2_coef=l2_coef)
  target = LAYERS[:, 2]  # the task wants layer 2 only

  def loss(p):
    out, state = mix.apply({"params": p}, LAYERS, mutable=["losses"])
    reg = sum(jax.tree_util.tree_leaves(state.get("losses", {})))
    return jnp.mean((out - target) ** 2) + reg

  opt = optax.adam(0.05)
  params = _params(np.zeros(3))
  opt_state = opt.init(params)

  @jax.jit
  def step(p, s):
    g = jax.grad(loss)(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  for _ in range(steps):
    params, opt_state = step(params, opt_state)
  return np.asarray(jax.nn.softmax(params["scalar_parameters"]))


def test_stronger_l2_stays_closer_to_uniform():
  weak, strong = _train(0.0), _train(1.0)
  dist = lambda s: np.max(np.abs(s - 1.0 / 3))
  assert weak[2] > 0.6  # without L2 the mix moves toward layer 2
  assert dist(strong) < 0.5 * dist(weak)


def test_not_trainable_gives_zero_grads():
  def loss(p, trainable):
    return jnp.sum(ScalarMix(3, trainable=trainable).apply({"params": p}, LAYERS) ** 2)
  g = jax.grad(loss)(_params(), False)
  assert np.all(np.asarray(g["scalar_parameters"]) == 0) and float(g["gamma"]) == 0.0
  g = jax.grad(loss)(_params(), True)
  assert np.any(np.asarray(g["scalar_parameters"]) != 0) and float(g["gamma"]) != 0.0
