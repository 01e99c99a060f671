"""ELMo the way its users use it: one-call Flax load, a frozen biLM under AdamW, cached token embeddings
(Elmo vocab_to_cache and Embedder token_embedding_file) and padding-safe sentence vectors."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from elmo_jax.data import chars
from elmo_jax.embedding import token_cache
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.model import Elmo, masked_mean, word_ids_for
from elmo_jax.sources import pretrained
from elmo_jax.training.freeze import bilm_labels, freeze_bilm
from paths import FIXTURE_DIR, FIXTURE_OPTIONS, FIXTURE_WEIGHTS

with open(os.path.join(FIXTURE_DIR, "lm_embeddings_sentences.json")) as _f:
  SENTENCES = [s.split() for row in json.load(_f) for s in row]
VOCAB_FILE = os.path.join(FIXTURE_DIR, "vocab_test.txt")
with open(VOCAB_FILE) as _f:
  VOCAB = [w.strip() for w in _f if w.strip()]

BATCH = [SENTENCES[0][:9], SENTENCES[1][:2], ["zzyzx", "and", "Qwertyuiop", "."], ["the"]]


@pytest.fixture(scope="module")
def embedder():
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)


@pytest.fixture(scope="module")
def loaded():
  return pretrained.load_elmo(FIXTURE_DIR, dropout=0.0)


@pytest.mark.slow
def test_load_elmo_matches_embedder(loaded, embedder):
  elmo, variables = loaded
  assert set(variables["params"]) == {"bilm", "scalar_mix_0"}
  out = jax.jit(elmo.apply)(variables, chars.batch_to_ids(BATCH))
  rep = np.asarray(out["elmo_representations"][0])
  for b, layers in enumerate(embedder.embed_sentences(BATCH)):
    np.testing.assert_allclose(rep[b, :len(BATCH[b])], layers.mean(axis=0), atol=1e-6)  # uniform mix, gamma 1


class Tagger(nn.Module):
  """The README's tagger head: ELMo (frozen biLM, learned mix) -> dense -> tags."""
  elmo: Elmo
  n_tags: int

  @nn.compact
  def __call__(self, char_ids, deterministic=True):
    out = self.elmo(char_ids, deterministic)
    return nn.Dense(self.n_tags)(out["elmo_representations"][0]), out["mask"]


@pytest.mark.slow
def test_freeze_bilm_under_adamw_weight_decay(loaded):
  elmo, elmo_vars = loaded
  elmo = elmo.clone(l2_coef=0.1)
  model = Tagger(elmo, n_tags=3)
  ids = chars.batch_to_ids(BATCH)
  tags = jnp.asarray(np.random.default_rng(0).integers(0, 3, ids.shape[:2]))
  params = jax.jit(model.init)(jax.random.key(0), ids)["params"]  # jitted: one compile, not one per op
  params = {**params, "elmo": elmo_vars["params"]}
  tx = freeze_bilm(optax.adamw(1e-2, weight_decay=0.5))
  labels = bilm_labels(params)
  assert set(jax.tree_util.tree_leaves(labels["elmo"]["bilm"])) == {"frozen"}
  assert set(jax.tree_util.tree_leaves(labels["Dense_0"])) == {"trainable"}

  def loss_fn(p):
    (logits, mask), state = model.apply({"params": p}, ids, mutable=["losses"])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tags)
    l2 = sum(jax.tree_util.tree_leaves(state["losses"]))
    return jnp.sum(ce * mask) / jnp.sum(mask) + l2, l2

  @jax.jit
  def step(p, s):
    (loss, l2), g = jax.value_and_grad(loss_fn, has_aux=True)(p)
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s, loss, l2

  opt_state = tx.init(params)
  start, losses = params, []
  for _ in range(5):
    params, opt_state, loss, l2 = step(params, opt_state)
    losses.append(float(loss))
  assert losses[-1] < losses[0]
  for a, b in zip(jax.tree_util.tree_leaves(start["elmo"]["bilm"]), jax.tree_util.tree_leaves(params["elmo"]["bilm"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # weight decay did not shrink them
  mix = params["elmo"]["scalar_mix_0"]["scalar_parameters"]
  assert np.any(np.asarray(mix) != 0)
  assert float(jax.jit(loss_fn)(params)[1]) == pytest.approx(0.1 * float(jnp.sum(mix ** 2)), rel=1e-5)  # the λ L2 term
  # Without the freeze, AdamW's decay alone moves the biLM (what the helper prevents).
  plain = optax.adamw(1e-2, weight_decay=0.5)
  moved = jax.jit(lambda p: optax.apply_updates(p, plain.update(jax.tree_util.tree_map(jnp.zeros_like, p),
                                                                plain.init(p), p)[0]))(start)
  assert np.any(np.asarray(moved["elmo"]["bilm"]["char_cnn"]["char_embed"])
                != np.asarray(start["elmo"]["bilm"]["char_cnn"]["char_embed"]))


@pytest.mark.slow
def test_vocab_to_cache_equals_char_path(loaded):
  elmo, variables = loaded
  vocab = sorted({w for s in BATCH for w in s} - {"zzyzx", "Qwertyuiop"}) + VOCAB[:50]
  cached_elmo, cached_vars = pretrained.load_elmo(FIXTURE_DIR, dropout=0.0, vocab_to_cache=vocab)
  assert cached_vars["token_cache"]["embedding"].shape == (len(vocab) + 1, 16)
  index = {w: k for k, w in enumerate(vocab)}
  ids = chars.batch_to_ids(BATCH)
  word_ids = word_ids_for(BATCH, index)
  assert word_ids[2, 0] == 0 and word_ids[2, 1] == index["and"] + 1  # OOV -> 0 -> char CNN
  apply, cached_apply = jax.jit(elmo.apply), jax.jit(cached_elmo.apply)  # one compile a shape, not one per op
  want = np.asarray(apply(variables, ids)["elmo_representations"][0])
  mixed = cached_apply(cached_vars, ids, word_ids=word_ids)
  np.testing.assert_allclose(np.asarray(mixed["elmo_representations"][0]), want, atol=1e-6, rtol=0)
  np.testing.assert_array_equal(np.asarray(mixed["mask"]), ids.any(-1))
  # All words cached: no char ids at all.
  known = [[w for w in s if w in index] for s in BATCH]
  only = cached_apply(cached_vars, None, word_ids=word_ids_for(known, index))
  ref = np.asarray(apply(variables, chars.batch_to_ids(known))["elmo_representations"][0])
  np.testing.assert_allclose(np.asarray(only["elmo_representations"][0]), ref, atol=1e-6, rtol=0)


def test_masked_mean_ignores_padding():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 2, 5, 4)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], bool)
  garbage = np.where(mask[:, None, :, None], x, 1e6).astype(np.float32)  # padding holds huge values
  got = np.asarray(masked_mean(jnp.asarray(garbage), jnp.asarray(mask)))
  np.testing.assert_allclose(got[0], x[0].mean(1), atol=1e-6)
  np.testing.assert_allclose(got[1], x[1, :, :2].mean(1), atol=1e-6)
  np.testing.assert_array_equal(got[2], 0)
  got3 = np.asarray(masked_mean(jnp.asarray(garbage[:, 0]), jnp.asarray(mask)))
  np.testing.assert_allclose(got3[1], x[1, 0, :2].mean(0), atol=1e-6)


def test_sentence_vectors_mixed_lengths_equal_alone(embedder):
  batch = BATCH + [[]]
  together = embedder.sentence_vectors(batch, batch_size=8)
  assert together.shape == (5, 3, 32)
  for b, sentence in enumerate(batch[:-1]):
    alone = embedder.embed_sentences([sentence])[0].mean(axis=1)
    np.testing.assert_allclose(together[b], alone, atol=1e-6)
  np.testing.assert_array_equal(together[-1], 0)
  np.testing.assert_allclose(embedder.sentence_vectors(batch, "top"), together[:, -1], atol=1e-7)
  np.testing.assert_allclose(embedder.sentence_vectors(batch, "average"), together.mean(1), atol=1e-6)
  w = [0.2, 0.3, 0.5]
  np.testing.assert_allclose(embedder.sentence_vectors(batch, w), np.einsum("l,bld->bd", w, together), atol=1e-6)
  with pytest.raises(ValueError, match="2 layer weights for 3 layers"):
    embedder.sentence_vectors(batch, [0.5, 0.5])


@pytest.mark.slow
def test_token_embedding_file_equals_char_path(tmp_path, embedder):
  path = tmp_path / "tokens.hdf5"
  embedder.dump_token_embeddings(VOCAB, path)
  table, tokens = token_cache.read(path, 16)
  assert tokens == VOCAB and table.shape == (len(VOCAB), 16)
  cached = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, token_embedding_file=path)
  batch = SENTENCES[:12] + [["zzyzx", "Qwertyuiop"], ["the", "unseen-word", "."]]
  assert any(w not in set(VOCAB) for s in batch for w in s)  # both paths are exercised
  for got, want in zip(cached.embed_sentences(batch, batch_size=4), embedder.embed_sentences(batch, batch_size=4)):
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_token_embedding_file_errors(tmp_path, embedder):
  with pytest.raises(token_cache.TokenCacheError, match="not found"):
    Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, token_embedding_file=tmp_path / "nope.hdf5")
  path = tmp_path / "t.hdf5"
  token_cache.write(path, np.zeros((2, 8), np.float32), ["a", "b"])
  with pytest.raises(token_cache.TokenCacheError, match=r"shape \(2, 8\), expected \(2, 16\)"):
    Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, token_embedding_file=path)
