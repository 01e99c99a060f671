"""Character CNN token encoder of bilm-tf: char embedding -> convolutions -> max -> highway -> projection.

Parameter names follow the original hdf5 datasets (`W_cnn_i`, `CNN_high_i/W_carry`, `CNN_proj/W_proj`, ...)
so that weight interop is a reshape, not a translation table.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from elmo_jax.model.config import BiLMConfig

Dtype = Any


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
