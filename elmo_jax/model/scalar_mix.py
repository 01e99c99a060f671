"""ScalarMix: e = gamma * sum_j softmax(w)_j * h_j (Peters et al. 2018, eq. 1), AllenNLP semantics."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

# AllenNLP's tiny_value_of_dtype(float32), added to the layer-norm variance.
_TINY = 1e-13


def masked_layer_norm(x: jax.Array, mask: jax.Array) -> jax.Array:
  """AllenNLP's ScalarMix layer norm: one mean/variance over all unmasked elements of the batch.

  x: [batch, time, dim]; mask: [batch, time].
  """
  m = mask.astype(x.dtype)[..., None]
  n = jnp.sum(m) * x.shape[-1]
  mean = jnp.sum(x * m) / n
  var = jnp.sum(((x * m - mean) * m) ** 2) / n
  return (x - mean) / jnp.sqrt(var + _TINY)


class ScalarMix(nn.Module):
  """A learned, softmax-normalised mix of `mixture_size` layers, times a scale gamma.

  Attributes:
    mixture_size: number of layers mixed (n_layers + 1 for ELMo).
    do_layer_norm: normalise each layer first (masked; needs `mask`).
    initial_scalar_parameters: starting logits w (default zeros = uniform weights).
    initial_gamma: starting gamma.
    trainable: if False the logits and gamma receive no gradient.
    l2_coef: if > 0, sows `l2_coef * sum(w**2)` into the "losses" collection (bilm-tf's weight_layers
      regulariser: pulls the weights toward uniform).
  """
  mixture_size: int
  do_layer_norm: bool = False
  initial_scalar_parameters: Sequence[float] | None = None
  initial_gamma: float = 1.0
  trainable: bool = True
  l2_coef: float = 0.0

  @nn.compact
  def __call__(self, layers: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """layers: [batch, mixture_size, time, dim] (the BiLM output) or [mixture_size, ...]; -> [batch, time, dim]."""
    if layers.ndim == 4:
      layers = jnp.moveaxis(layers, 1, 0)
    if layers.shape[0] != self.mixture_size:
      raise ValueError(f"ScalarMix expects {self.mixture_size} layers, got {layers.shape[0]}")
    init = self.initial_scalar_parameters
    if init is None:
      init = [0.0] * self.mixture_size
    if len(init) != self.mixture_size:
      raise ValueError(f"initial_scalar_parameters has {len(init)} values, expected {self.mixture_size}")
    w = self.param("scalar_parameters", lambda _: jnp.asarray(init, jnp.float32))
    gamma = self.param("gamma", lambda _: jnp.asarray(self.initial_gamma, jnp.float32))
    if not self.trainable:
      w, gamma = jax.lax.stop_gradient(w), jax.lax.stop_gradient(gamma)
    if self.l2_coef > 0.0:
      self.sow("losses", "scalar_mix_l2", self.l2_coef * jnp.sum(w ** 2))
    s = jax.nn.softmax(w)
    if self.do_layer_norm:
      if mask is None:
        raise ValueError("do_layer_norm=True needs a mask [batch, time]")
      layers = jax.vmap(masked_layer_norm, in_axes=(0, None))(layers, mask)
    return gamma * jnp.tensordot(s, layers, axes=(0, 0))
