"""The bidirectional language model: char CNN token encoder + forward and backward LSTM stacks.

`BiLM.__call__` is the inference path (AllenNLP/bilm-tf `BidirectionalLanguageModel`): it wraps each
sentence in `<S>`/`</S>`, reads the backward direction reversed within each sentence's length and returns
`[batch, n_layers + 1, time, 2 * P]` with the boundary tokens removed again. `BiLM.lm_windows` is the training path
over windows that already contain the boundaries, in each direction's reading order.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from elmo_jax.data import chars
from elmo_jax.model.char_cnn import CharCNN, embed_compact
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.dropout import Dropout, Rows
from elmo_jax.model.lstm import BiLSTMStack, LSTMState, stacked_weights
from elmo_jax.model.lstm_step import StepWeights


COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def make_model(options: dict[str, Any], *, dropout: float = 0.0, dtype: Any = "float32", unroll: int = 1) -> "BiLM":
  """The biLM of validated `options` (options.json): dropout rate, matmul dtype ('float32', 'bfloat16' or a
  jnp dtype; params stay float32) and scan unroll factor."""
  if isinstance(dtype, str):
    if dtype not in COMPUTE_DTYPES:
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    dtype = COMPUTE_DTYPES[dtype]
  return BiLM(BiLMConfig.from_options(options), dropout_rate=float(dropout), dtype=dtype, unroll=int(unroll))


def reverse_within_length(x: jax.Array, lengths: jax.Array) -> jax.Array:
  """Reverses `x [batch, time, ...]` along time within each row's length; padding stays in place."""
  t = jnp.arange(x.shape[1])[None, :]
  idx = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
  idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, idx, axis=1)


class InferenceConstants(NamedTuple):
  """What an inference call reads that the params alone decide, made once per params (`inference_constants`)
  by a caller that runs many calls: a call that made them would run the char CNN's highway layers for two rows
  (reading all their weights: 32 MB in `small`, 268 MB in `original`) and copy every LSTM weight."""
  boundary: jax.Array  # [2, P]: `BiLM.boundary_embeddings`, the char CNN's `<S>` and `</S>`
  lstm: tuple[StepWeights, ...]  # every layer's, `lstm.stacked_weights`


class BiLM(nn.Module):
  """ELMo's biLM.

  Attributes:
    config: model shape (see `BiLMConfig.from_options`).
    dropout_rate: dropout on LSTM inputs and on the LM output while training.
    dtype: matmul dtype (float32 or bfloat16); params stay float32.
    unroll: scan unroll factor.
  """
  config: BiLMConfig
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32
  unroll: int = 1

  def setup(self):
    cfg = self.config
    self.char_cnn = CharCNN(cfg, dtype=self.dtype)
    self.lstm = BiLSTMStack(cfg, self.dropout_rate, self.dtype, self.unroll)
    self.output_dropout = Dropout(self.dropout_rate)

  def embed_tokens(self, char_ids: jax.Array, compact: bool = False) -> jax.Array:
    """Context-independent token embeddings: `[..., max_chars]` -> `[..., P]` (0 where no token).

    compact: the char CNN runs over each distinct token once, at the narrowest exact char width
    (`char_cnn.embed_compact`; inference: not differentiable). The same values to float rounding."""
    mask = jnp.any(char_ids > 0, axis=-1, keepdims=True)
    if compact and not self.is_initializing():
      cfg = self.config
      cnn, params = CharCNN(cfg, dtype=self.dtype, parent=None), self.char_cnn.variables["params"]
      emb = embed_compact(lambda ids: cnn.apply({"params": params}, ids), char_ids,
                          max(w for w, _ in cfg.filters), lead=1 if cfg.n_words else 0)
    else:
      emb = self.char_cnn(char_ids)
    return jnp.where(mask, emb, 0.0)

  def __call__(self, char_ids: jax.Array | None = None, *, token_embeddings: jax.Array | None = None,
               mask: jax.Array | None = None, state: LSTMState | None = None, add_bos_eos: bool = True,
               deterministic: bool = True, skip_padding: bool = False,
               constants: InferenceConstants | None = None) -> dict[str, Any]:
    """Contextual representations of whole sentences.

    Args:
      char_ids: [batch, time, token_width] from `batch_to_ids` (without `<S>`/`</S>`), or None when
        `token_embeddings` [batch, time, P] and `mask` [batch, time] are given (precomputed, e.g. deduped).
      state: initial LSTMState (stateful use) or None for zeros.
      add_bos_eos: wrap each sentence in `<S>`/`</S>` and remove them from the output.
      skip_padding: inference (not differentiable): the char CNN runs over each distinct token once and the
        LSTMs stop after the longest row (the same result to float rounding).
      constants: `inference_constants` of these params, made ahead by a caller that runs many calls: their
        `<S>`/`</S>` and (with `skip_padding`) their LSTM weights as the steps read them; else made in the call.
    Returns:
      {"layers": [batch, n_layers + 1, time, 2P] (layer 0 = [tok; tok]), "mask": [batch, time] bool,
       "state": final LSTMState}.
    """
    if token_embeddings is None:
      mask = jnp.any(char_ids > 0, axis=-1)
      token_embeddings = self.embed_tokens(char_ids, compact=skip_padding)
    elif mask is None:
      raise ValueError("token_embeddings needs a mask [batch, time]")
    mask = mask.astype(bool)
    emb = jnp.where(mask[..., None], token_embeddings.astype(jnp.float32), 0.0)
    lengths = jnp.sum(mask, axis=1).astype(jnp.int32)
    if add_bos_eos:
      bos, eos = self.boundary_embeddings() if constants is None else constants.boundary
      batch, time = mask.shape
      t = jnp.arange(time + 2)[None, :, None]
      shifted = jnp.pad(emb, ((0, 0), (1, 1), (0, 0)))
      emb = jnp.where(t == 0, bos, jnp.where(t == lengths[:, None, None] + 1, eos, shifted))
      lengths = jnp.where(lengths > 0, lengths + 2, 0)  # an empty row stays empty
      mask = jnp.arange(time + 2)[None, :] < lengths[:, None]
      emb = jnp.where(mask[..., None], emb, 0.0)
    bwd = reverse_within_length(emb, lengths)
    n_steps = jnp.max(lengths) if skip_padding else None
    outputs, new_state = self.lstm(emb, bwd, mask, mask, state, deterministic, n_steps,
                                     weights=None if constants is None else constants.lstm)
    fwd_layers = outputs[:, 0]  # [L, B, T, P]
    bwd_layers = jax.vmap(reverse_within_length, in_axes=(0, None))(outputs[:, 1], lengths)
    contextual = jnp.concatenate([fwd_layers, bwd_layers], axis=-1)  # [L, B, T, 2P]
    token_layer = jnp.concatenate([emb, emb], axis=-1)[None]
    layers = jnp.transpose(jnp.concatenate([token_layer, contextual], 0), (1, 0, 2, 3))
    if add_bos_eos:
      layers = layers[:, :, 1:-1]
      mask = mask[:, 1:-1] & (jnp.arange(layers.shape[2])[None, :] < (lengths[:, None] - 2))
      layers = jnp.where(mask[:, None, :, None], layers, 0.0)
    return {"layers": layers, "mask": mask, "state": new_state}

  def boundary_embeddings(self) -> jax.Array:
    """The char CNN's `<S>` and `</S>`: `[2, P]` (a model's own ids for them where it has its own chars)."""
    special = np.asarray(self.config.special_ids or [
        chars.token_to_ids(token, self.config.max_characters_per_token)
        for token in (chars.BOS_TOKEN, chars.EOS_TOKEN)], np.int32)
    return self.char_cnn(jnp.asarray(special))

  def lstm_stretch(self, fwd_x: jax.Array, bwd_x: jax.Array, fwd_mask: jax.Array, bwd_mask: jax.Array,
                   state: LSTMState, lstm_weights: Sequence[StepWeights] | None = None
                   ) -> tuple[jax.Array, LSTMState]:
    """Both LSTM stacks over one stretch of each direction's reading (inference): `fwd_x`, `bwd_x` [batch, time,
    P] with `<S>`/`</S>` already in place, masks [batch, time] (a prefix of each row), `state` carried in from
    the stretch before. Running a sentence stretch by stretch gives the bits of one run over all of it (the
    steps are the same, `lstm_steps`). `lstm_weights`: `InferenceConstants.lstm`, or None. Returns outputs
    [n_layers, 2, batch, time, P], the state."""
    n_steps = jnp.maximum(jnp.max(jnp.sum(fwd_mask, 1)), jnp.max(jnp.sum(bwd_mask, 1))).astype(jnp.int32)
    return self.lstm(fwd_x, bwd_x, fwd_mask, bwd_mask, state, True, n_steps, weights=lstm_weights)

  def packed(self, x: jax.Array, mask: jax.Array, starts: jax.Array, ends: jax.Array,
             lstm_weights: Sequence[StepWeights] | None = None) -> jax.Array:
    """Layers of rows that hold several sentences end to end (inference): `x` [batch, time, P] with each
    sentence's `<S>` and `</S>` embeddings in place, `mask` [batch, time] (a prefix of each row), `starts` /
    `ends` [batch, time] bool at each sentence's `<S>` / `</S>`. The forward stacks start from zeros at every
    `<S>`; the backward stacks read each row reversed, so they meet each sentence at its `</S>`, reversed, and
    start from zeros there: every sentence gets the numbers a row of its own would give (to float rounding: a
    row is rounded by its position). Returns `[batch, n_layers + 1, time, 2P]` over every slot, the boundaries'
    included (layer 0 = [x; x]); the slots past a row's length are zeros."""
    lengths = jnp.sum(mask, axis=1).astype(jnp.int32)
    bwd_x, bwd_starts = reverse_within_length(x, lengths), reverse_within_length(ends, lengths)
    n_steps = jnp.max(lengths)
    outputs, _ = self.lstm(x, bwd_x, mask, mask, None, True, n_steps, weights=lstm_weights,
                           resets=(starts & mask, bwd_starts & mask))
    bwd_layers = jax.vmap(reverse_within_length, in_axes=(0, None))(outputs[:, 1], lengths)
    contextual = jnp.concatenate([outputs[:, 0], bwd_layers], axis=-1)  # [L, B, T, 2P]
    x = jnp.where(mask[..., None], x, 0.0)
    token_layer = jnp.concatenate([x, x], axis=-1)[None]
    return jnp.transpose(jnp.concatenate([token_layer, contextual], 0), (1, 0, 2, 3))

  def lm_windows(self, fwd_char_ids: jax.Array | None, bwd_char_ids: jax.Array | None, state: LSTMState | None = None,
         deterministic: bool = True, *, token_chars: jax.Array | None = None, fwd_index: jax.Array | None = None,
         bwd_index: jax.Array | None = None, rows: Rows = None) -> tuple[jax.Array, jax.Array, LSTMState]:
    """Training path over windows that already hold `<S>`/`</S>` (bilm-tf's training graph).

    Args:
      fwd_char_ids, bwd_char_ids: [batch, unroll, max_chars], each in its direction's reading order; or None
        with the deduped form (`data/dedupe.py`) instead:
      token_chars: [n_shards, U, max_chars] distinct tokens of each data shard (row 0 = no token);
      fwd_index, bwd_index: [batch, unroll] indices into the table of the row's shard (rows split into
        n_shards consecutive chunks); 0 = padding.
      state: LSTMState carried from the previous window (truncated BPTT) or None.
      rows: (first row, global rows) when these rows are one device's shard of a global batch: dropout
        masks are those of the global batch, so they do not depend on the number of devices.
    Returns:
      top-layer outputs forward [batch, unroll, P] and backward [batch, unroll, P] (dropout applied while
      training, as bilm-tf does before the softmax), and the final LSTMState.
    """
    if token_chars is not None:
      fwd_emb, bwd_emb = self._gather_embeddings(token_chars, fwd_index, bwd_index)
      fwd_mask, bwd_mask = fwd_index > 0, bwd_index > 0
    else:
      both = self.embed_tokens(jnp.concatenate([fwd_char_ids, bwd_char_ids], 0))
      fwd_emb, bwd_emb = jnp.split(both, 2, axis=0)
      fwd_mask = jnp.any(fwd_char_ids > 0, axis=-1)
      bwd_mask = jnp.any(bwd_char_ids > 0, axis=-1)
    outputs, new_state = self.lstm(fwd_emb, bwd_emb, fwd_mask, bwd_mask, state, deterministic, rows=rows)
    top = outputs[-1]  # [2, batch, time, P]
    if self.dropout_rate > 0.0:
      top = self.output_dropout(top, deterministic, rows, batch_axis=1)
    return top[0], top[1], new_state

  def _gather_embeddings(self, token_chars: jax.Array, fwd_index: jax.Array, bwd_index: jax.Array
                         ) -> tuple[jax.Array, jax.Array]:
    """Embeds each shard's distinct tokens once, then gathers every position's embedding from its shard."""
    n_shards, u, n_chars = token_chars.shape
    table = self.embed_tokens(token_chars.reshape(n_shards * u, n_chars)).reshape(n_shards, u, -1)
    batch, time = fwd_index.shape
    # Both directions' indices per shard [S, 2 * rows * T, 1]: a gather batched over the shard axis, which
    # GSPMD keeps local to each device when the shard axis and the rows are split over the same mesh axis.
    idx = jnp.stack([fwd_index, bwd_index], 1).reshape(n_shards, -1, 1)
    emb = jnp.take_along_axis(table, idx, axis=1, mode="clip")
    emb = emb.reshape(batch, 2, time, -1)
    return emb[:, 0], emb[:, 1]


def inference_constants(model: BiLM, params: Any) -> InferenceConstants:
  """The `InferenceConstants` of `model` with these params (its "params" collection); jit it."""
  return InferenceConstants(model.apply({"params": params}, method=BiLM.boundary_embeddings),
                            stacked_weights(params["lstm"], model.config))
