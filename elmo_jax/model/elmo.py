"""`Elmo`: the AllenNLP `Elmo` contract in Flax — a frozen biLM, its scalar mixes and dropout."""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from elmo_jax.data import chars
from elmo_jax.model.bilm import BiLM, BiLMConfig, InferenceConstants, inference_constants
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.lstm_step import StepWeights
from elmo_jax.model.scalar_mix import ScalarMix


class Elmo(nn.Module):
  """Task-specific ELMo representations for a downstream model.

  Params live under `bilm` (load them with `elmo_jax.formats.weights.load_hdf5`) and `scalar_mix_{k}`.

  Attributes:
    config: biLM shape.
    num_output_representations: independent mixes (e.g. one for the input, one for the output of a
      task's encoder).
    dropout: dropout on each returned representation (AllenNLP default 0.5).
    do_layer_norm: layer-normalise each biLM layer inside the mixes.
    requires_grad: let gradients flow into the biLM (default False: the biLM is frozen, and runs its inference
      form: the char CNN over each distinct token once, the LSTMs over the longest sentence's steps; docs/latency.md).
    scalar_mix_parameters: fixed mix logits (then the mixes are not trained), as in AllenNLP.
    l2_coef: L2 penalty on the mix logits, sown into the "losses" collection.
    stateful: carry each batch row's final LSTM state into the next call (bilm-tf semantics). The state
      lives in the mutable "lstm_state" collection (`apply(..., mutable=["lstm_state"])`); drop the
      collection to reset it. Requires `max_batch_size`.
    dtype: matmul dtype of the biLM.
    vocab_to_cache: words whose char-CNN embeddings are precomputed (AllenNLP's `vocab_to_cache`, bilm-tf's
      `dump_token_embeddings`). The table lives in the "token_cache" collection (`embed_vocab` fills it;
      `elmo_jax.sources.pretrained.load_elmo` does so for you); `word_ids` (from `word_ids_for`) then select
      cached rows and the char CNN runs only for words outside the cache.

  A frozen biLM reads what its params alone decide (`bilm.InferenceConstants`: the `<S>`/`</S>` embeddings, the LSTM
  weights laid out for its steps) from the "bilm_constants" collection where there is one (`elmo_variables` makes it
  from the params it is given), instead of making them in every call: the same values.
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
  vocab_to_cache: Sequence[str] | None = None

  @nn.compact
  def __call__(self, char_ids: jax.Array | None, deterministic: bool = True, *,
               word_ids: jax.Array | None = None) -> dict[str, Any]:
    """char_ids: [batch, time, 50] from `batch_to_ids`; word_ids: [batch, time] from `word_ids_for`.

    With `word_ids` (needs `vocab_to_cache`), a position with id k > 0 takes row k of the cached table; one
    with id 0 is padding, or a word outside the cache that the char CNN embeds from `char_ids` (pass
    `char_ids=None` when every word is cached: then no char CNN runs at all).

    Returns {"elmo_representations": list of [batch, time, 2P], "mask": [batch, time] bool}.
    """
    frozen = not self.requires_grad
    if frozen:
      # A frozen biLM is a constant to differentiation (its params reach it through stop_gradient), so it runs its
      # inference form: the char CNN over each distinct token once, the LSTMs over the longest sentence's
      # steps only -- loops with run-time trip counts, which reverse mode could not differentiate.
      bilm = nn.map_variables(BiLM, "params", lambda v: jax.tree_util.tree_map(jax.lax.stop_gradient, v),
                              init=self.is_initializing(), methods=["__call__", "embed_tokens"]
                              )(self.config, dtype=self.dtype, name="bilm")
    else:
      bilm = BiLM(self.config, dtype=self.dtype, name="bilm")
    token_embeddings = mask = None
    if word_ids is not None:
      if self.vocab_to_cache is None:
        raise ValueError("word_ids need Elmo(vocab_to_cache=...)")
      table = self.variable("token_cache", "embedding", jnp.zeros,
                            (len(self.vocab_to_cache) + 1, self.config.projection_dim), jnp.float32)
      hit = word_ids > 0
      token_embeddings = jnp.take(table.value, word_ids, axis=0)
      mask = hit
      if char_ids is not None:
        missed = jnp.where(hit[..., None], 0, char_ids)  # the char CNN runs for words outside the cache only
        token_embeddings = jnp.where(hit[..., None], token_embeddings, bilm.embed_tokens(missed, compact=frozen))
        mask = hit | jnp.any(char_ids > 0, axis=-1)
      char_ids = None
    elif char_ids is None:
      raise ValueError("Elmo needs char_ids or word_ids")
    batch = (char_ids if char_ids is not None else mask).shape[0]
    state = None
    if self.stateful:
      if batch > self.max_batch_size:
        raise ValueError(f"batch of {batch} rows exceeds max_batch_size={self.max_batch_size}")
      c = self.variable("lstm_state", "c", lambda: zero_state(self.config, self.max_batch_size)[0])
      h = self.variable("lstm_state", "h", lambda: zero_state(self.config, self.max_batch_size)[1])
      state = (c.value[:, :, :batch], h.value[:, :, :batch])
    out = bilm(char_ids, token_embeddings=token_embeddings, mask=mask, state=state, skip_padding=frozen,
               constants=self._constants() if frozen else None)
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

  def _constants(self) -> InferenceConstants | None:
    """The frozen biLM's constants where `elmo_variables` made them (else None: made in the call)."""
    if not self.has_variable("bilm_constants", "boundary"):
      return None
    made = self.variables["bilm_constants"]
    return InferenceConstants(made["boundary"], tuple(StepWeights(**made["lstm"][f"layer_{k}"])
                                                      for k in range(self.config.n_layers)))


# --- loading helpers (pure: the caller reads the files, see `elmo_jax.sources.pretrained.load_elmo`) -----------
def word_ids_for(sentences: Sequence[Sequence[str]], index: Mapping[str, int], pad_to: int | None = None
                 ) -> np.ndarray:
  """Sentences -> `[batch, time]` int32 ids for `Elmo(word_ids=...)`: k + 1 for `vocab_to_cache[k]`, 0 else.

  `index` is `{word: k}` (`{w: k for k, w in enumerate(vocab_to_cache)}`, built once).
  """
  time = max([len(s) for s in sentences] + [pad_to or 0])
  out = np.zeros((len(sentences), time), np.int32)
  for b, sentence in enumerate(sentences):
    for t, word in enumerate(sentence):
      k = index.get(word)
      out[b, t] = 0 if k is None else k + 1
  return out


def embed_vocab(config: BiLMConfig, bilm_params: Any, vocab: Sequence[str], batch_size: int = 1024,
                dtype: Any = jnp.float32, on_chunk: Callable[[int], Any] | None = None) -> np.ndarray:
  """Char-CNN embedding of every word: `[len(vocab) + 1, P]` float32, row 0 zeros (padding), row k + 1 word k.

  Computed in fixed-size chunks (one compiled shape) with the same `BiLM.embed_tokens` as the char path;
  `on_chunk(n_words)` is called after each chunk (progress).
  """
  model = BiLM(config, dtype=dtype)
  run = jax.jit(lambda p, ids: model.apply({"params": p}, ids, method=BiLM.embed_tokens))
  out = np.zeros((len(vocab) + 1, config.projection_dim), np.float32)
  for start in range(0, len(vocab), batch_size):
    words = vocab[start:start + batch_size]
    ids = np.zeros((batch_size, config.max_characters_per_token), np.int32)
    for i, word in enumerate(words):
      ids[i] = chars.token_to_ids(word, config.max_characters_per_token)
    out[start + 1:start + 1 + len(words)] = np.asarray(run(bilm_params, ids))[:len(words)]
    if on_chunk is not None:
      on_chunk(len(words))
  return out


def elmo_variables(elmo: Elmo, bilm_params: Any, token_cache: np.ndarray | None = None) -> dict[str, Any]:
  """Ready `variables` for `elmo.apply`: the given biLM params, fresh mixes (logits from
  `scalar_mix_parameters` or zeros, gamma 1), the token cache and a zero LSTM state where used, and for a frozen
  biLM its "bilm_constants" (made from these params: make the variables again for other biLM params, as for the
  token cache; the LSTM weights take their size again: 18 MB in `small`, 288 MB in `original`).

  Shapes come from `jax.eval_shape` of `elmo.init`, so nothing is compiled or run.
  """
  cfg = elmo.config
  dummy = np.zeros((1, 1, cfg.token_width), np.int32)
  kwargs = {"word_ids": np.zeros((1, 1), np.int32)} if elmo.vocab_to_cache is not None else {}
  shapes = jax.eval_shape(elmo.init, jax.random.key(0), dummy, **kwargs)
  logits = elmo.scalar_mix_parameters or [0.0] * (cfg.n_layers + 1)
  params: dict[str, Any] = {"bilm": jax.tree_util.tree_map(jnp.asarray, bilm_params)}
  for k in range(elmo.num_output_representations):
    params[f"scalar_mix_{k}"] = {"scalar_parameters": jnp.asarray(logits, jnp.float32),
                                 "gamma": jnp.ones((), jnp.float32)}
  if jax.tree_util.tree_structure(shapes["params"]) != jax.tree_util.tree_structure(params):
    raise ValueError("biLM params do not match the Elmo config (different tree)")
  for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(shapes["params"])):
    if got.shape != want.shape:
      raise ValueError(f"biLM params do not match the Elmo config: shape {got.shape}, expected {want.shape}")
  variables: dict[str, Any] = {"params": params}
  if "lstm_state" in shapes:
    variables["lstm_state"] = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["lstm_state"])
  if "token_cache" in shapes:
    if token_cache is None:
      token_cache = embed_vocab(cfg, bilm_params, elmo.vocab_to_cache)
    want = shapes["token_cache"]["embedding"].shape
    if token_cache.shape != want:
      raise ValueError(f"token cache has shape {token_cache.shape}, expected {want}")
    variables["token_cache"] = {"embedding": jnp.asarray(token_cache, jnp.float32)}
  if not elmo.requires_grad:
    variables["bilm_constants"] = bilm_constants(elmo, params["bilm"])
  return variables


def bilm_constants(elmo: Elmo, bilm_params: Any) -> dict[str, Any]:
  """A frozen `elmo`'s "bilm_constants" collection, made from these biLM params (`bilm.inference_constants`):
  `{"boundary": [2, P], "lstm": {"layer_k": StepWeights as a dict}}`."""
  made = jax.jit(functools.partial(inference_constants, BiLM(elmo.config, dtype=elmo.dtype)))(bilm_params)
  return {"boundary": made.boundary, "lstm": {f"layer_{k}": w._asdict() for k, w in enumerate(made.lstm)}}


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean over time of the unmasked steps: x `[batch, time, dim]` or `[batch, layers, time, dim]`,
  mask `[batch, time]` -> `[batch, dim]` / `[batch, layers, dim]`; an all-padding row gives zeros."""
  m = mask.astype(x.dtype)
  if x.ndim == 4:
    m = m[:, None]
  total = jnp.sum(x * m[..., None], axis=-2)
  return total / jnp.maximum(jnp.sum(m, axis=-1), 1.0)[..., None]
