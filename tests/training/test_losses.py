"""The softmax losses of the trainer: full NLL, TF-style sampled softmax and its log-uniform sampler."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.training import losses


_sampled_nll = jax.jit(losses.sampled_softmax_nll, static_argnames=("num_sampled", "dtype", "oversample"))
_sample = jax.jit(losses.sample_log_uniform_unique, static_argnums=(1, 2, 3))


def _problem(v=40, p=6, shape=(3, 5), seed=0):
  r = np.random.RandomState(seed)
  h = r.randn(*shape, p).astype(np.float32)
  w = (r.randn(v, p) / math.sqrt(p)).astype(np.float32)
  b = (0.1 * r.randn(v)).astype(np.float32)
  targets = r.randint(0, v, size=shape).astype(np.int32)
  return h, w, b, targets


def _np_full_nll(h, w, b, targets):
  logits = h.astype(np.float64) @ w.astype(np.float64).T + b
  m = logits.max(-1, keepdims=True)
  lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
  return lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]


def _np_log_uniform_p(ids, v):
  ids = np.asarray(ids, np.float64)
  return np.log((ids + 2.0) / (ids + 1.0)) / np.log(v + 1.0)


def test_full_softmax_matches_numpy():
  h, w, b, t = _problem()
  got = np.asarray(losses.full_softmax_nll(jnp.asarray(h), jnp.asarray(t), jnp.asarray(w), jnp.asarray(b)))
  want = _np_full_nll(h, w, b, t)
  assert got.shape == t.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # bfloat16 matmuls stay close (accumulated in float32).
  got_bf16 = losses.full_softmax_nll(jnp.asarray(h), jnp.asarray(t), jnp.asarray(w), jnp.asarray(b), jnp.bfloat16)
  np.testing.assert_allclose(np.asarray(got_bf16), want, rtol=3e-2, atol=3e-2)
  # Scored in chunks of positions (a large vocabulary's eval step): the same NLLs, padding dropped.
  vocab = w.shape[0]
  chunked = losses.full_softmax_nll(jnp.asarray(h), jnp.asarray(t), jnp.asarray(w), jnp.asarray(b),
                                    max_logits=4 * vocab)
  assert t.size % 4 and chunked.shape == t.shape  # 4 positions per chunk, the last one padded
  np.testing.assert_allclose(np.asarray(chunked), want, rtol=1e-5, atol=1e-5)


def test_log_uniform_log_prob_and_expected_count_formulas():
  v = 50
  ids = np.arange(v)
  p = np.exp(np.asarray(losses.log_uniform_log_prob(jnp.asarray(ids), v)))
  np.testing.assert_allclose(p, _np_log_uniform_p(ids, v), rtol=1e-5)
  np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-5)  # a distribution over [0, V)
  for tries in (1, 7, 300):
    got = np.asarray(losses.expected_count(jnp.asarray(ids), jnp.asarray(tries), v))
    np.testing.assert_allclose(got, 1.0 - (1.0 - _np_log_uniform_p(ids, v)) ** tries, rtol=1e-5, atol=1e-7)
  # One try: the expected count is the probability itself.
  np.testing.assert_allclose(np.asarray(losses.expected_count(jnp.asarray(ids), jnp.asarray(1), v)), p, rtol=1e-5)


def test_sampler_single_draw_follows_log_uniform():
  """num_sampled=1: the sample is the first draw, distributed exactly as P(k) (chi-square check)."""
  v, n = 20, 20_000
  keys = jax.random.split(jax.random.PRNGKey(1), n)
  ids, tries, valid = jax.jit(jax.vmap(lambda k: losses.sample_log_uniform_unique(k, 1, v)))(keys)
  ids, tries, valid = np.asarray(ids)[:, 0], np.asarray(tries), np.asarray(valid)
  assert valid.all() and (tries == 1).all()
  assert ids.min() >= 0 and ids.max() < v
  observed = np.bincount(ids, minlength=v)
  expected = n * _np_log_uniform_p(np.arange(v), v)
  chi2 = float(((observed - expected) ** 2 / expected).sum())
  assert chi2 < 60.0, (chi2, observed, expected.round())  # 19 dof: mean 19, p(chi2 > 60) ~ 1e-6
  # Not uniform: id 0 is drawn far more often than the last id.
  assert observed[0] > 5 * observed[-1]


def test_sampler_unique_ids_and_inclusion_frequency():
  v, s, n = 30, 8, 4000
  keys = jax.random.split(jax.random.PRNGKey(2), n)
  ids, tries, valid = jax.jit(jax.vmap(lambda k: losses.sample_log_uniform_unique(k, s, v, 8)))(keys)
  ids, tries, valid = np.asarray(ids), np.asarray(tries), np.asarray(valid)
  assert valid.all()  # 64 draws always find 8 distinct ids among 30
  for row in ids[:200]:
    assert len(set(row.tolist())) == s
  assert ids.min() >= 0 and ids.max() < v
  assert (tries >= s).all() and (tries <= 8 * s).all()
  # The inclusion frequency of id k roughly follows the expected count 1 - (1 - p)^tries.
  freq = np.bincount(ids.reshape(-1), minlength=v) / n
  pred = (1.0 - (1.0 - _np_log_uniform_p(np.arange(v), v)[None, :]) ** tries[:, None]).mean(0)
  np.testing.assert_allclose(freq, pred, atol=0.05)
  assert freq[0] > 0.8 and freq[-1] < 0.3


def test_sampler_marks_unfilled_slots_invalid():
  """Fewer distinct draws than requested (tiny oversample): the missing slots are invalid, tries = all draws."""
  v, s = 1000, 50
  ids, tries, valid = _sample(jax.random.PRNGKey(3), s, v, 1)
  ids, valid = np.asarray(ids), np.asarray(valid)
  n_distinct = int(valid.sum())
  assert 0 < n_distinct < s  # 50 log-uniform draws over 1000 ids repeat the frequent ones
  assert int(tries) == s
  assert len(set(ids[valid].tolist())) == n_distinct
  assert not valid[n_distinct:].any()


def _np_sampled_nll(h, w, b, targets, sampled, tries, v, remove_hits=True):
  """Reference of tf.nn.sampled_softmax_loss for one sample set shared by all positions."""
  p = _np_log_uniform_p(np.arange(v), v)
  log_q = np.log(1.0 - (1.0 - p) ** tries)
  out = np.zeros(targets.shape)
  for idx in np.ndindex(targets.shape):
    t = targets[idx]
    true = h[idx] @ w[t] + b[t] - log_q[t]
    others = [h[idx] @ w[k] + b[k] - log_q[k] for k in sampled if k != t or not remove_hits]
    logits = np.array([true] + others, np.float64)
    m = logits.max()
    out[idx] = m + np.log(np.exp(logits - m).sum()) - true
  return out


def test_sampled_softmax_matches_reference_and_removes_accidental_hits():
  v, s = 40, 12
  h, w, b, _ = _problem(v=v, shape=(4, 6), seed=4)
  key = jax.random.PRNGKey(5)
  sampled, tries, valid = _sample(key, s, v, 4)
  sampled, tries = np.asarray(sampled), int(tries)
  assert np.asarray(valid).all()
  # Half the targets are drawn from the sample set itself: accidental hits that must count only once.
  r = np.random.RandomState(6)
  targets = np.where(r.rand(4, 6) < 0.5, r.choice(sampled, (4, 6)), r.randint(0, v, (4, 6))).astype(np.int32)
  hits = np.isin(targets, sampled)
  assert hits.any() and (~hits).any()
  got = np.asarray(_sampled_nll(jnp.asarray(h), jnp.asarray(targets), jnp.asarray(w), jnp.asarray(b), key,
                                num_sampled=s))
  want = _np_sampled_nll(h, w, b, targets, sampled, tries, v)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  # Without the removal the target would be counted twice: a higher loss exactly at the hits.
  doubled = _np_sampled_nll(h, w, b, targets, sampled, tries, v, remove_hits=False)
  np.testing.assert_allclose(doubled[~hits], want[~hits])
  assert np.all(doubled[hits] > got[hits] + 1e-3)
  assert np.all(np.isfinite(got)) and np.all(got >= 0)


@pytest.mark.parametrize("num_sampled_offset, tol", [(1, 0.01), (0, 0.002)])
def test_sampled_softmax_approaches_full_softmax(num_sampled_offset, tol):
  """num_sampled = V - 1 (or V) with many tries: every id (but at most one) is a negative with weight ~1."""
  v = 100
  h, w, b, t = _problem(v=v, shape=(4, 8), seed=7)
  h, w, b, t = map(jnp.asarray, (h, w, b, t))
  full = float(jnp.mean(losses.full_softmax_nll(h, t, w, b)))
  keys = jax.random.split(jax.random.PRNGKey(8), 4)
  s = v - num_sampled_offset
  sampled = [float(jnp.mean(_sampled_nll(h, t, w, b, k, num_sampled=s, oversample=200))) for k in keys]
  rel = abs(np.mean(sampled) - full) / full
  assert rel < tol, (full, sampled)
