"""The task models: a BiLSTM tagger and a BiLSTM + pooled classifier, with or without ELMo (pure Flax).

Token representation x_k = [word embedding; char CNN] (the baseline, learned from scratch). With ELMo,
ELMo_k = gamma * sum_j softmax(w)_j h_kj (Peters et al. 2018, eq. 1; `ScalarMix`, with lambda * ||w||^2
sown into the "losses" collection), dropout on it, and [x_k; ELMo_k] goes into the task BiLSTM; with
`elmo_at_output` a second, independent mix is concatenated to the BiLSTM's output as the paper does
for SNLI/SQuAD. The biLM layers h_kj come either precomputed (frozen: `layers`) or from the `BiLM`
submodule run on `bilm_char_ids` (fine-tuning: its params live under `bilm`, see
`elmo_jax.training.freeze.bilm_labels`). `Elmo` is the same BiLM + ScalarMix + Dropout; this model splits it
so the frozen path can take cached layers.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from elmo_jax.model import BiLM, BiLMConfig, CharCNN, ScalarMix


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """Shape of a task model (hashable: a module attribute)."""
  task: str                 # "pos" (one label per token) or "sentiment" (one per sentence)
  n_classes: int
  vocab_size: int
  elmo: str = "none"        # "none", "frozen" (cached layers in) or "finetune" (BiLM inside)
  word_dim: int = 100
  char_dim: int = 16
  char_filters: tuple[tuple[int, int], ...] = ((1, 16), (2, 32), (3, 64), (4, 64))
  char_out: int = 64
  hidden: int = 128         # per direction
  dropout: float = 0.5
  pooling: str = "max"      # sentiment: "max" or "attention"
  elmo_dropout: float = 0.5
  mix_l2: float = 0.001
  elmo_at_output: bool = False
  do_layer_norm: bool = False
  n_bilm_layers: int = 3    # biLM representation layers (LSTM layers + the token layer)
  bilm: BiLMConfig | None = None  # fine-tuning only


def _char_cnn_config(cfg: "TaskConfig", max_chars: int) -> BiLMConfig:
  """The baseline's own small char CNN (one highway layer, relu) in the biLM's config type; the LSTM
  fields are unused by `CharCNN`."""
  return BiLMConfig(filters=tuple(cfg.char_filters), char_dim=cfg.char_dim, n_highway=1, activation="relu",
                    max_characters_per_token=max_chars, lstm_dim=0, projection_dim=cfg.char_out, n_layers=0,
                    cell_clip=None, proj_clip=None, use_skip_connections=False)


class TaskModel(nn.Module):
  config: TaskConfig

  def _mixes(self, layers: jax.Array, mask: jax.Array, deterministic: bool) -> list[jax.Array]:
    cfg = self.config
    out = []
    for k in range(2 if cfg.elmo_at_output else 1):
      mix = ScalarMix(cfg.n_bilm_layers, cfg.do_layer_norm, l2_coef=cfg.mix_l2, name=f"scalar_mix_{k}")(
          layers, mask)
      out.append(nn.Dropout(cfg.elmo_dropout)(mix, deterministic=deterministic))
    return out

  @nn.compact
  def __call__(self, word_ids: jax.Array, char_ids: jax.Array, mask: jax.Array, *,
               layers: jax.Array | None = None, bilm_char_ids: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    """word_ids, mask: [batch, time]; char_ids: [batch, time, chars]; layers: [batch, L, time, 2P] (frozen);
    bilm_char_ids: [batch, time, bilm chars] (finetune). Returns logits [batch, time, C] (pos) or
    [batch, C] (sentiment)."""
    cfg = self.config
    words = nn.Embed(cfg.vocab_size, cfg.word_dim, name="word_embed")(word_ids)
    char_emb = CharCNN(_char_cnn_config(cfg, char_ids.shape[-1]), name="char_cnn")(char_ids)
    char_emb = jnp.where((char_ids > 0).any(-1, keepdims=True), char_emb, 0.0)
    x = jnp.concatenate([words, char_emb], -1)
    mixes: list[jax.Array] = []
    if cfg.elmo == "finetune":
      if bilm_char_ids is None or cfg.bilm is None:
        raise ValueError("elmo='finetune' needs TaskConfig.bilm and bilm_char_ids")
      layers = BiLM(cfg.bilm, name="bilm")(bilm_char_ids)["layers"]
    if cfg.elmo != "none":
      if layers is None:
        raise ValueError(f"elmo={cfg.elmo!r} needs the biLM layers")
      mixes = self._mixes(layers, mask, deterministic)
      x = jnp.concatenate([x, mixes[0]], -1)
    x = nn.Dropout(cfg.dropout)(x, deterministic=deterministic)
    lengths = jnp.sum(mask, -1).astype(jnp.int32)
    h = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(cfg.hidden), name="fwd"),
                         nn.RNN(nn.OptimizedLSTMCell(cfg.hidden), name="bwd"), name="bilstm")(
                             x, seq_lengths=lengths)
    if len(mixes) > 1:
      h = jnp.concatenate([h, mixes[1]], -1)
    h = nn.Dropout(cfg.dropout)(h, deterministic=deterministic)
    if cfg.task == "pos":
      return nn.Dense(cfg.n_classes, name="out")(h)
    m = mask[..., None]
    if cfg.pooling == "attention":
      scores = nn.Dense(1, name="attention")(jnp.tanh(nn.Dense(cfg.hidden, name="attention_hidden")(h)))
      weights = jax.nn.softmax(jnp.where(m, scores, -1e9), axis=1)
      pooled = jnp.sum(weights * h, axis=1)
    else:
      pooled = jnp.max(jnp.where(m, h, -1e9), axis=1)
      pooled = jnp.where(jnp.any(m, axis=1), pooled, 0.0)
    hidden = nn.relu(nn.Dense(cfg.hidden, name="hidden")(pooled))
    hidden = nn.Dropout(cfg.dropout)(hidden, deterministic=deterministic)
    return nn.Dense(cfg.n_classes, name="out")(hidden)


def init_params(model: TaskModel, batch: dict[str, Any], seed: int) -> Any:
  """Fresh params for `batch` shapes (the fine-tuning biLM part is replaced by the caller)."""
  # jitted: one compile instead of one per initializer and per op of the forward pass that init runs
  init = jax.jit(lambda key, *args, **kw: model.init({"params": key}, *args, **kw)["params"])
  return init(jax.random.key(seed), batch["word_ids"], batch["char_ids"], batch["mask"],
              layers=batch.get("layers"), bilm_char_ids=batch.get("bilm_char_ids"))
