"""`Elmo`: the AllenNLP `Elmo` contract in Flax — a frozen biLM, its scalar mixes and dropout."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from elmo_jax.model.bilm import BiLM, BiLMConfig
from elmo_jax.model.scalar_mix import ScalarMix


class Elmo(nn.Module):
  """Task-specific ELMo representations for a downstream model.

  Params live under `bilm` (load them with `elmo_jax.weights.load_hdf5`) and `scalar_mix_{k}`.

  Attributes:
    config: biLM shape.
    num_output_representations: independent mixes (e.g. one for the input, one for the output of a
      task's encoder).
    dropout: dropout on each returned representation (AllenNLP default 0.5).
    do_layer_norm: layer-normalise each biLM layer inside the mixes.
    requires_grad: let gradients flow into the biLM (default False: the biLM is frozen).
    scalar_mix_parameters: fixed mix logits (then the mixes are not trained), as in AllenNLP.
    l2_coef: L2 penalty on the mix logits, sown into the "losses" collection.
    stateful: carry each batch row's final LSTM state into the next call (bilm-tf semantics). The state
      lives in the mutable "lstm_state" collection (`apply(..., mutable=["lstm_state"])`); drop the
      collection to reset it. Requires `max_batch_size`.
    dtype: matmul dtype of the biLM.
  """
  config: BiLMConfig
  num_output_representations: int = 1
  dropout: float = 0.5
  do_layer_norm: bool = False
  requires_grad: bool = False
  scalar_mix_parameters: Sequence[float] | None = None
  l2_coef: float = 0.0
  stateful: bool = False
  max_batch_size: int = 128
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, char_ids: jax.Array, deterministic: bool = True) -> dict[str, Any]:
    """char_ids: [batch, time, 50] from `batch_to_ids`.

    Returns {"elmo_representations": list of [batch, time, 2P], "mask": [batch, time] bool}.
    """
    bilm = BiLM(self.config, dtype=self.dtype, name="bilm")
    batch = char_ids.shape[0]
    state = None
    if self.stateful:
      if batch > self.max_batch_size:
        raise ValueError(f"batch of {batch} rows exceeds max_batch_size={self.max_batch_size}")
      cfg = self.config
      c = self.variable("lstm_state", "c", jnp.zeros,
                        (cfg.n_layers, 2, self.max_batch_size, cfg.lstm_dim), jnp.float32)
      h = self.variable("lstm_state", "h", jnp.zeros,
                        (cfg.n_layers, 2, self.max_batch_size, cfg.projection_dim), jnp.float32)
      state = (c.value[:, :, :batch], h.value[:, :, :batch])
    out = bilm(char_ids, state=state)
    if self.stateful and not self.is_initializing():
      c.value = c.value.at[:, :, :batch].set(out["state"][0])
      h.value = h.value.at[:, :, :batch].set(out["state"][1])
    layers = out["layers"]
    if not self.requires_grad:
      layers = jax.lax.stop_gradient(layers)
    reps = []
    for k in range(self.num_output_representations):
      mix = ScalarMix(self.config.n_layers + 1, self.do_layer_norm, self.scalar_mix_parameters,
                      trainable=self.scalar_mix_parameters is None, l2_coef=self.l2_coef,
                      name=f"scalar_mix_{k}")(layers, out["mask"])
      reps.append(nn.Dropout(self.dropout)(mix, deterministic=deterministic))
    return {"elmo_representations": reps, "mask": out["mask"]}
