"""Train-time token dedupe (elmo_jax/data/dedupe.py): the tables, and BiLM.lm_windows's deduped path."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.data import chars
from elmo_jax.model import BiLM, BiLMConfig, zero_state
from elmo_jax.data import dedupe

from tiny import tiny_options

WORDS = ["<S>", "</S>", "the", "cat", "sat", ".", "a", "bank", "ée", "x"]


def _batch(rows=8, time=6, seed=0):
  """fwd/bwd windows of random words with some padded tail positions, as `make_lm_iterator` makes them."""
  r = np.random.default_rng(seed)
  ids = np.stack([chars.token_to_ids(w, 50) for w in WORDS]).astype(np.int32)
  fwd = ids[r.integers(0, len(WORDS), (rows, time))]
  bwd = ids[r.integers(0, len(WORDS), (rows, time))]
  fwd[-1, time // 2:] = 0  # padding
  bwd[-1, time // 2:] = 0
  weights = np.any(fwd > 0, -1).astype(np.float32)
  return {"fwd_chars": fwd, "bwd_chars": bwd, "fwd_targets": r.integers(0, 9, (rows, time)).astype(np.int32),
          "bwd_targets": r.integers(0, 9, (rows, time)).astype(np.int32), "weights": weights}


def test_bucket_sizes():
  assert [dedupe.bucket_size(n, 10_000) for n in (1, 64, 65, 97, 129, 200, 257)] == [64, 64, 96, 128, 192, 256,
                                                                                         384]
  assert dedupe.bucket_size(70, cap=66) == 70  # never below what is needed
  assert dedupe.bucket_size(50, cap=60) == 60


@pytest.mark.parametrize("n_shards", [1, 2, 4])
def test_tables_reconstruct_the_batch(n_shards):
  batch = _batch()
  snapshot = {k: v.copy() for k, v in batch.items()}
  out = dedupe.dedupe_batch(batch, n_shards)
  for k, v in snapshot.items():  # a pure function: the iterator's batch is left as it was
    np.testing.assert_array_equal(batch[k], v)
  table, fi, bi = out["token_chars"], out["fwd_index"], out["bwd_index"]
  rows = batch["fwd_chars"].shape[0]
  cap = 2 * rows // n_shards * batch["fwd_chars"].shape[1] + 1  # every position distinct, plus the empty row
  assert table.shape[:2] == (n_shards, min(64, cap)) and table.dtype == np.int32
  assert not table[:, 0].any()  # the "no token" row
  shard = np.repeat(np.arange(n_shards), rows // n_shards)[:, None]
  np.testing.assert_array_equal(table[shard, fi], batch["fwd_chars"])
  np.testing.assert_array_equal(table[shard, bi], batch["bwd_chars"])
  assert np.array_equal(fi == 0, ~np.any(batch["fwd_chars"] > 0, -1))
  for k in ("fwd_targets", "bwd_targets", "weights"):
    np.testing.assert_array_equal(out[k], batch[k])
  assert "fwd_chars" not in out
  # each shard's table holds exactly its own rows' distinct tokens (and no more)
  for k in range(n_shards):
    sl = slice(k * rows // n_shards, (k + 1) * rows // n_shards)
    words = {tuple(w) for w in np.concatenate([batch["fwd_chars"][sl], batch["bwd_chars"][sl]]).reshape(-1, 50)
             if w.any()}
    assert dedupe.distinct_tokens({"token_chars": table[k:k + 1]}) == len(words)


def test_rows_must_split():
  with pytest.raises(ValueError, match="do not split"):
    dedupe.dedupe_batch(_batch(rows=6), 4)


@pytest.mark.parametrize("n_shards", [1, 2])
def test_lm_deduped_path_equals_plain(n_shards):
  """Same top-layer outputs, final state and parameter gradients as running the CNN on every position."""
  options = tiny_options(skip=True, cell_clip=3.0, proj_clip=3.0)
  model = BiLM(BiLMConfig.from_options(options))
  batch = _batch()
  params = jax.jit(functools.partial(model.init, method=BiLM.lm_windows))(  # jitted: one compile, not one per op
      jax.random.key(0), batch["fwd_chars"], batch["bwd_chars"])["params"]
  state = jax.tree_util.tree_map(lambda a: a + 0.1, zero_state(model.config, batch["fwd_chars"].shape[0]))
  deduped = dedupe.dedupe_batch(batch, n_shards)

  def plain(p):
    f, b, s = model.apply({"params": p}, batch["fwd_chars"], batch["bwd_chars"], state, method=BiLM.lm_windows)
    return jnp.sum(f ** 2) + jnp.sum(jnp.sin(b)), (f, b, s)

  def fast(p):
    f, b, s = model.apply({"params": p}, None, None, state, method=BiLM.lm_windows, token_chars=deduped["token_chars"],
                          fwd_index=deduped["fwd_index"], bwd_index=deduped["bwd_index"])
    return jnp.sum(f ** 2) + jnp.sum(jnp.sin(b)), (f, b, s)

  (l1, out1), g1 = jax.jit(jax.value_and_grad(plain, has_aux=True))(params)
  (l2, out2), g2 = jax.jit(jax.value_and_grad(fast, has_aux=True))(params)
  np.testing.assert_allclose(l1, l2, rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(out1), jax.tree_util.tree_leaves(out2)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
  assert float(jnp.max(jnp.abs(out1[0][-1, -1]))) == 0.0  # a padded position still outputs zeros
