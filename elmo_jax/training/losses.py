"""The shared softmax of the forward and backward LMs: full, or sampled as bilm-tf trains it.

Sampled softmax follows `tf.nn.sampled_softmax_loss` with its default `log_uniform_candidate_sampler`
(unique=True): one candidate set per step shared by all positions, logits corrected by
`-log(expected_count)`, accidental hits (a candidate equal to the target) removed.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax


def _logits(h: jax.Array, w: jax.Array, b: jax.Array, dtype) -> jax.Array:
  return jnp.einsum("...p,vp->...v", h.astype(dtype), w.astype(dtype),
                    preferred_element_type=jnp.float32) + b


MAX_LOGITS = 2**28  # logits held at once by `full_softmax_nll` (1 GiB of float32)


def full_softmax_nll(h: jax.Array, targets: jax.Array, w: jax.Array, b: jax.Array,
                     dtype=jnp.float32, max_logits: int = MAX_LOGITS) -> jax.Array:
  """Token NLL `[...]` of targets `[...]` under softmax(h W^T + b); h `[..., P]`, W `[V, P]`.

  Over `max_logits` logits ([positions, V]: 8 GB of float32 for 128 x 20 positions of lm1b's 793k words),
  the positions are scored in chunks one after another (`lax.map`), so the eval step's memory does not
  grow with the batch; each position's NLL is computed alone either way.
  """
  nll = lambda h, t: optax.softmax_cross_entropy_with_integer_labels(_logits(h, w, b, dtype), t)
  lead, vocab = targets.shape, w.shape[0]
  n = math.prod(lead)
  rows = max(max_logits // vocab, 1)
  if n <= rows:
    return nll(h, targets)
  chunks = -(-n // rows)
  pad = chunks * rows - n
  h_rows = jnp.pad(h.reshape(n, -1), ((0, pad), (0, 0))).reshape(chunks, rows, -1)
  t_rows = jnp.pad(targets.reshape(n), (0, pad)).reshape(chunks, rows)
  return jax.lax.map(lambda ht: nll(*ht), (h_rows, t_rows)).reshape(-1)[:n].reshape(lead)


def log_uniform_log_prob(ids: jax.Array, vocab_size: int) -> jax.Array:
  """log P(k) of TF's LogUniformSampler: P(k) = log((k + 2) / (k + 1)) / log(V + 1)."""
  k = ids.astype(jnp.float32)
  return jnp.log(jnp.log1p(1.0 / (k + 1.0))) - jnp.log(jnp.log(vocab_size + 1.0))


def sample_log_uniform_unique(rng: jax.Array, num_sampled: int, vocab_size: int,
                              oversample: int = 4) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`num_sampled` distinct ids from the log-uniform distribution, the number of tries, a validity mask.

  TF draws until it has `num_sampled` distinct ids and counts the draws; we draw `oversample * num_sampled`
  at once (static shapes) and keep the first distinct ones, which is the same process cut at the same point.
  """
  n = oversample * num_sampled
  u = jax.random.uniform(rng, (n,), jnp.float32)
  draws = jnp.floor(jnp.exp(u * jnp.log(vocab_size + 1.0))).astype(jnp.int32) - 1
  draws = jnp.clip(draws, 0, vocab_size - 1)
  order = jnp.argsort(draws, stable=True)
  sorted_draws = draws[order]
  first_sorted = jnp.concatenate([jnp.array([True]), sorted_draws[1:] != sorted_draws[:-1]])
  is_first = jnp.zeros((n,), bool).at[order].set(first_sorted)
  rank = jnp.cumsum(is_first) - 1  # index among distinct ids, in draw order
  keep = is_first & (rank < num_sampled)
  ids = jnp.zeros((num_sampled,), jnp.int32).at[jnp.where(keep, rank, num_sampled)].set(draws, mode="drop")
  # tries = position of the draw that completed the set (1-based); all draws if it never completed, in
  # which case the unfilled slots are invalid.
  completed = is_first & (rank == num_sampled - 1)
  tries = jnp.where(jnp.any(completed), jnp.argmax(completed) + 1, n)
  valid = jnp.arange(num_sampled) < jnp.sum(is_first)
  return ids, tries, valid


def expected_count(ids: jax.Array, tries: jax.Array, vocab_size: int) -> jax.Array:
  """TF's expected count for unique sampling: 1 - (1 - p)^tries."""
  p = jnp.exp(log_uniform_log_prob(ids, vocab_size))
  return -jnp.expm1(tries.astype(jnp.float32) * jnp.log1p(-p))


def take_rows(w: jax.Array, ids: jax.Array, dtype, shared: bool) -> jax.Array:
  """Rows `w[ids]` [..., P] in the compute dtype (`shared`: the ids are the same on every device)."""
  del shared
  return w[ids].astype(dtype)


def sampled_softmax_nll(h: jax.Array, targets: jax.Array, w: jax.Array, b: jax.Array, rng: jax.Array,
                        num_sampled: int, dtype=jnp.float32, oversample: int = 4, take=take_rows) -> jax.Array:
  """Sampled-softmax NLL `[...]`; an unbiased-in-the-limit estimate of `full_softmax_nll`.

  `take(w, ids, dtype, shared)` fetches softmax rows: `take_rows`, or the data-parallel step's when W is
  split over the devices (`training/step.py`).
  """
  vocab_size = b.shape[0]
  sampled, tries, valid = sample_log_uniform_unique(rng, num_sampled, vocab_size, oversample)
  sampled = jax.lax.stop_gradient(sampled)
  true_logit = jnp.einsum("...p,...p->...", h.astype(dtype), take(w, targets, dtype, False),
                          preferred_element_type=jnp.float32) + b[targets]
  true_logit = true_logit - jnp.log(expected_count(targets, tries, vocab_size))
  sampled_logits = _logits(h, take(w, sampled, dtype, True), b[sampled], dtype)
  sampled_logits = sampled_logits - jnp.log(expected_count(sampled, tries, vocab_size))
  hit = targets[..., None] == sampled
  sampled_logits = jnp.where(hit | ~valid, -1e30, sampled_logits)
  logits = jnp.concatenate([true_logit[..., None], sampled_logits], axis=-1)
  return jax.nn.logsumexp(logits, axis=-1) - true_logit
