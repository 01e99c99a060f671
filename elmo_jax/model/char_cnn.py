"""Character CNN token encoder of bilm-tf: char embedding -> convolutions -> max -> highway -> projection.

Parameter names follow the original hdf5 datasets (`W_cnn_i`, `CNN_high_i/W_carry`, `CNN_proj/W_proj`, ...)
so that weight interop is a reshape, not a translation table.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from elmo_jax.model.config import BiLMConfig

Dtype = Any
# Char positions the CNN sees for tokens short enough (else all of `token_width`): measured on 2 CPU cores the
# convolutions cost in proportion to the positions, and most tokens fit in 16.
CHAR_WIDTHS = (16, 24, 32)
# Tokens per char-CNN call of `embed_compact`: the first size that holds a call's distinct tokens, else chunks of the
# last. A call costs about the same fixed time (the highway's weights read and packed: ~2.3 ms for `small` on 2 CPU
# cores) plus ~0.08 ms a row, so 33-64 tokens run faster as one chunk of 64 than as two of 32 (the whole frozen
# `Elmo`, sentences of 33-64 tokens: p50 19.4 ms vs 21.7 ms); 16 gained nothing.
COMPACT_ROWS = (32, 64)


def _normal(stddev: float):
  return nn.initializers.normal(stddev=stddev)


def symmetric_uniform(limit: float):
  """U(-limit, limit), TF's random_uniform_initializer (flax's uniform starts at 0)."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -limit, limit)
  return init


def _dot(x: jax.Array, w: jax.Array, dtype: Dtype) -> jax.Array:
  return jnp.dot(x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


class Highway(nn.Module):
  """bilm-tf's highway layer: the sigmoid "carry" gate multiplies the ReLU transform branch.

  out = g * relu(x W_t + b_t) + (1 - g) * x,  g = sigmoid(x W_c + b_c); b_c starts at -2 (mostly pass x).
  `convention="allennlp"` (AllenNLP's and ELMoForManyLangs' Highway): the gate keeps the input,
  out = g * x + (1 - g) * relu(x W_t + b_t); b_c starts at +1 (mostly pass x), as there.
  """
  dtype: Dtype = jnp.float32
  convention: str = "bilm-tf"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:  # [n, d] -> [n, d]
    d = x.shape[-1]
    init = _normal(float(np.sqrt(1.0 / d)))
    w_c = self.param("W_carry", init, (d, d))
    keeps_input = self.convention == "allennlp"
    b_c = self.param("b_carry", nn.initializers.constant(1.0 if keeps_input else -2.0), (d,))
    w_t = self.param("W_transform", init, (d, d))
    b_t = self.param("b_transform", nn.initializers.zeros, (d,))
    gate = jax.nn.sigmoid(_dot(x, w_c, self.dtype) + b_c)
    transform = jax.nn.relu(_dot(x, w_t, self.dtype) + b_t)
    if keeps_input:
      return gate * x + (1.0 - gate) * transform
    return gate * transform + (1.0 - gate) * x


class Projection(nn.Module):
  """Linear projection of the filters down to the LSTM projection size (bilm-tf's CNN_proj)."""
  features: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:  # [n, d] -> [n, features]
    d = x.shape[-1]
    w = self.param("W_proj", _normal(float(np.sqrt(1.0 / d))), (d, self.features))
    b = self.param("b_proj", nn.initializers.zeros, (self.features,))
    return _dot(x, w, self.dtype) + b


class CharCNN(nn.Module):
  """Maps char ids `[..., max_chars]` (0 = no token) to token embeddings `[..., projection_dim]`.

  With a word embedding (`config.n_words`, ELMoForManyLangs) the ids are `[..., 1 + max_chars]`: the word id
  (+1) first, and the word's vector [word_dim] goes before the highway output into the projection.

  Attributes:
    config: the biLM shape; this module reads `filters` ((width, n_filters) per convolution), `char_dim`,
      `n_highway`, `highway` (its convention), `activation` ('relu' or 'tanh', applied after the max over
      positions, as bilm-tf), `n_characters` (rows of the id space including the zero row for id 0),
      `n_words`, `word_dim` and `projection_dim` (bilm-tf projects only when it differs from the total filter
      count; with a word embedding there is always a projection, as in ELMoForManyLangs).
    dtype: computation dtype of the matmuls/convolutions (params stay float32).
  """
  config: BiLMConfig
  dtype: Dtype = jnp.float32

  @property
  def n_filters(self) -> int:
    return sum(n for _, n in self.config.filters)

  @nn.compact
  def __call__(self, char_ids: jax.Array) -> jax.Array:
    cfg = self.config
    lead, width = char_ids.shape[:-1], char_ids.shape[-1]
    ids = char_ids.reshape(-1, width)
    if cfg.n_words:
      word_ids, ids = ids[:, 0], ids[:, 1:]
    # The stored table has no row for id 0 ("no token"); a constant zero row keeps it out of training.
    table = self.param("char_embed", symmetric_uniform(1.0), (cfg.n_characters - 1, cfg.char_dim))
    table = jnp.concatenate([jnp.zeros((1, cfg.char_dim), table.dtype), table], 0)
    x = jnp.take(table, ids, axis=0).astype(self.dtype)  # [n, max_chars, char_dim]

    act = jax.nn.relu if cfg.activation == "relu" else jnp.tanh
    pooled = []
    for i, (width, num) in enumerate(cfg.filters):
      if cfg.activation == "relu":
        init = symmetric_uniform(0.05)  # Kim et al. 2015, as bilm-tf
      else:
        init = _normal(float(np.sqrt(1.0 / (width * cfg.char_dim))))
      w = self.param(f"W_cnn_{i}", init, (width, cfg.char_dim, num))
      b = self.param(f"b_cnn_{i}", nn.initializers.zeros, (num,))
      y = jax.lax.conv_general_dilated(
          x, w.astype(self.dtype), window_strides=(1,), padding="VALID",
          dimension_numbers=("NWC", "WIO", "NWC"), preferred_element_type=self.dtype)
      # max-pool before the activation, as bilm-tf; identical for monotone activations. y [n, positions,
      # filters] is the char CNN's largest array: in the matmul dtype (accumulated in float32, then rounded;
      # its only consumer is the max, and rounding is monotone), half its bytes and its gradient's with bf16.
      pooled.append(act(jnp.max(y, axis=1) + b))
    h = jnp.concatenate(pooled, axis=-1)  # [n, n_filters]

    for i in range(cfg.n_highway):
      h = Highway(dtype=self.dtype, convention=cfg.highway, name=f"CNN_high_{i}")(h)
    if cfg.n_words:
      words = self.param("word_embed", symmetric_uniform(0.25), (cfg.n_words, cfg.word_dim))  # EFML's init
      words = jnp.concatenate([jnp.zeros((1, cfg.word_dim), words.dtype), words], 0)
      h = jnp.concatenate([jnp.take(words, word_ids, axis=0), h], axis=-1)  # [word; chars], EFML's order
    if cfg.projection_dim != h.shape[-1] or cfg.n_words:
      h = Projection(cfg.projection_dim, dtype=self.dtype, name="CNN_proj")(h)
    return h.reshape(*lead, h.shape[-1])


def widths(token_width: int) -> list[int]:
  """The char CNN's input widths for tokens of `token_width` ids: `CHAR_WIDTHS` below it, and itself."""
  return [w for w in CHAR_WIDTHS if w < token_width] + [token_width]


def embed_compact(cnn: Any, char_ids: jax.Array, max_filter_width: int, lead: int = 0,
                  rows: Sequence[int] = COMPACT_ROWS) -> jax.Array:
  """`cnn(ids [rows, width])` -> `[rows, P]` over each distinct token of `char_ids [..., token_width]` once
  (positions with no token skipped), in chunks of the first of `rows` that holds them all, else of the last (a loop
  with a run-time trip count), at the narrowest of `widths` exact for every token of the call: `[..., P]`,
  unspecified where no token. Inference: not differentiable (reverse mode).

  Exact for the same reason as the embedder's cut (`embedding/step.char_widths`): every position after a token's
  last char holds the same padding id (whatever the char scheme's), so every conv window that starts there gives
  the same value, and a cut keeping `max_filter_width` of them keeps the max over positions. A token's last char
  is the last position whose id differs from the final position's (`lead` word ids before the chars kept).
  """
  lead_shape, token_width = char_ids.shape[:-1], char_ids.shape[-1]
  ids = jnp.asarray(char_ids).reshape(-1, token_width)
  n = ids.shape[0]
  has_token = jnp.any(ids > 0, axis=-1)
  differs = ids[:, lead:] != ids[:, -1:]
  n_chars = jnp.where(jnp.any(differs, -1), differs.shape[1] - jnp.argmax(differs[:, ::-1], -1), 0)
  need = lead + jnp.max(jnp.where(has_token, n_chars, 0)) + max_filter_width
  cuts = widths(token_width)
  width = jnp.minimum(jnp.searchsorted(jnp.asarray(cuts), need), len(cuts) - 1)
  # The distinct tokens: positions sorted by (no token, then every id: one sort, each column a key); the first
  # of each run of equal rows is a distinct token, and they come first in `distinct` (in sorted order).
  keys = (jnp.logical_not(has_token).astype(jnp.int32),) + tuple(ids[:, j] for j in range(token_width))
  *_, position = jax.lax.sort(keys + (jnp.arange(n, dtype=jnp.int32),), num_keys=len(keys))
  sorted_ids = ids[position]
  first = has_token[position] & jnp.concatenate([jnp.ones((1,), bool), jnp.any(sorted_ids[1:] != sorted_ids[:-1],
                                                                              -1)])
  count = jnp.sum(first).astype(jnp.int32)
  distinct = jnp.concatenate([sorted_ids[jnp.argsort(~first, stable=True)], jnp.zeros((max(rows), token_width),
                                                                                      ids.dtype)])
  at_width = [lambda x, w=w: cnn(x[:, :w]).astype(jnp.float32) for w in cuts]
  out_dim = jax.eval_shape(at_width[0], ids[:1]).shape[-1]

  def run(size):
    def chunk(k, out):
      x = jax.lax.dynamic_slice_in_dim(distinct, k * size, size)
      return jax.lax.dynamic_update_slice_in_dim(out, jax.lax.switch(width, at_width, x), k * size, 0)
    return lambda: jax.lax.fori_loop(0, (count + size - 1) // size, chunk,
                                     jnp.zeros((n + max(rows), out_dim), jnp.float32))

  out = jax.lax.switch(jnp.minimum(jnp.searchsorted(jnp.asarray(rows), count), len(rows) - 1), [run(s) for s in rows])
  # each position takes its token's row: the distinct tokens before it in sorted order (a running count)
  out = jnp.zeros((n, out_dim), jnp.float32).at[position].set(out[jnp.maximum(jnp.cumsum(first) - 1, 0)])
  return out.reshape(*lead_shape, out_dim)
