"""The Embedder's arguments checked and its outputs selected: one-line errors naming the method called.

Kept apart from the Embedder itself so the device code reads without them.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def check_batch_size(batch_size: Any, caller: str = "") -> None:
  """ValueError (one line, naming `caller`: `Embedder(batch_size=0)`) unless `batch_size` is an int >= 1."""
  if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"{caller + ': ' if caller else ''}batch_size must be a positive int, got {batch_size!r}")


def check_sentences(sentences: Any, batch_size: Any, caller: str = "embed_sentences") -> list[list[str]]:
  """Sentences (any iterable of token iterables) as lists of str tokens; one-line errors for the rest,
  naming `caller` (the method the user called).

  A str where a sentence or a list of sentences belongs would otherwise be embedded character by
  character, silently.
  """
  check_batch_size(batch_size)
  hint = ("a sentence is a list of tokens: split text first, e.g. text.split() or "
          "elmo_jax.data.Tokenizer()(text)")
  if isinstance(sentences, (str, bytes)):
    raise TypeError(f"{caller} takes a list of sentences, got a {type(sentences).__name__} "
                    f"({sentences[:40]!r}); {hint}")
  try:
    sentences = list(sentences)
  except TypeError:
    raise TypeError(f"{caller} takes an iterable of sentences, got {type(sentences).__name__}") from None
  out = []
  for i, sentence in enumerate(sentences):
    if isinstance(sentence, (str, bytes)):
      raise TypeError(f"sentence {i} is a {type(sentence).__name__} ({sentence[:40]!r}); {hint}")
    try:
      tokens = list(sentence)
    except TypeError:
      raise TypeError(f"sentence {i} is a {type(sentence).__name__}, not a list of tokens; {hint}") from None
    for j, token in enumerate(tokens):
      if not isinstance(token, str):
        raise TypeError(f"sentence {i}, token {j} is a {type(token).__name__} ({token!r}); tokens must be str"
                        + (" (decode bytes first)" if isinstance(token, bytes) else ""))
    out.append(tokens)
  return out


def select_layers(layers: np.ndarray, layer: str | int | Sequence[float]) -> np.ndarray:
  """`[n_layers + 1, time, 2P]` -> the chosen output: all, top, average, layer k or a weighted sum."""
  choices = "'all', 'top', 'average', an int layer index or one weight per layer"
  if isinstance(layer, (bool, np.bool_)):  # an int to Python, and numpy indexes with it as a mask: refuse
    raise ValueError(f"layer must be {choices}, got the bool {layer!r}")
  if isinstance(layer, str):
    if layer == "all":
      return layers
    if layer == "top":
      return layers[-1]
    if layer == "average":
      return layers.mean(axis=0)
    raise ValueError(f"layer must be {choices}, got {layer!r}")
  if isinstance(layer, (int, np.integer)):
    if not -layers.shape[0] <= layer < layers.shape[0]:
      raise ValueError(f"layer {layer} is out of range: the model has {layers.shape[0]} layers "
                       f"(0 .. {layers.shape[0] - 1}, or -1 for the top)")
    return layers[layer]
  try:
    weights = np.asarray(layer, np.float32)
  except (TypeError, ValueError):
    raise TypeError(f"layer must be {choices}, got {type(layer).__name__} {layer!r}"[:200]) from None
  if np.asarray(layer).dtype == bool:
    raise ValueError(f"layer must be {choices}, got bools {layer!r}"[:200])
  if weights.ndim != 1:
    raise TypeError(f"layer must be {choices}, got {type(layer).__name__} {layer!r}"[:200])
  if weights.shape != layers.shape[:1]:
    raise ValueError(f"{len(weights)} layer weights for {layers.shape[0]} layers")
  return np.tensordot(weights, layers, axes=(0, 0))


def sentence_means(per_sentence: Sequence[np.ndarray], layer: str | int | Sequence[float], n_layers: int,
                   dim: int) -> np.ndarray:
  """Each sentence's layers `[n_layers, n_tokens, dim]` -> the mean over its tokens of `select_layers(layer)`
  (no tokens: zeros), `[n, ...]` float32."""
  shape = select_layers(np.zeros((n_layers, 1, dim), np.float32), layer)[..., 0, :].shape
  out = np.zeros((len(per_sentence),) + shape, np.float32)
  for i, layers in enumerate(per_sentence):
    if layers.shape[1]:  # unpadded per sentence, so the mean sees only its real tokens
      out[i] = select_layers(layers, layer).mean(axis=-2, dtype=np.float64)
  return out
