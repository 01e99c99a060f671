"""`Embedder`: sentences in, ELMo layers out (numpy), fast and with a bounded number of compiled shapes.

    emb = Embedder.from_files("options.json", "weights.hdf5")
    layers = emb.embed_sentences([["The", "bank", "flooded", "."]])  # [(n_layers + 1, 4, 2P) float32]

Speed: sentences are sorted by length and padded to a few time buckets; within each batch every distinct
token runs through the char CNN once (exact: the CNN sees one token at a time) and is gathered back.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax import options as options_lib
from elmo_jax import weights as weights_lib
from elmo_jax.model import BiLM, BiLMConfig

_TIME_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def bucket(n: int, buckets: Sequence[int] = _TIME_BUCKETS) -> int:
  """Smallest bucket >= n; beyond the table, the next multiple of the largest bucket."""
  for b in buckets:
    if n <= b:
      return b
  top = buckets[-1]
  return -(-n // top) * top


def _check_sentences(sentences: Any, batch_size: Any) -> list[list[str]]:
  """Sentences (any iterable of token iterables) as lists of str tokens; one-line errors for the rest.

  A str where a sentence or a list of sentences belongs would otherwise be embedded character by
  character, silently.
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
  hint = ("a sentence is a list of tokens: split text first, e.g. text.split() or "
          "elmo_jax.data.Tokenizer()(text)")
  if isinstance(sentences, (str, bytes)):
    raise TypeError(f"embed_sentences takes a list of sentences, got a {type(sentences).__name__} "
                    f"({sentences[:40]!r}); {hint}")
  try:
    sentences = list(sentences)
  except TypeError:
    raise TypeError(f"embed_sentences takes an iterable of sentences, got {type(sentences).__name__}") from None
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


def _pow2_at_least(n: int, floor: int = 64) -> int:
  return max(floor, 1 << max(0, n - 1).bit_length())


class Embedder:
  """Runs a `BiLM` over tokenized sentences.

  Args:
    options: options.json content.
    params: `BiLM` params (as `weights.load_hdf5` returns them).
    softmax: optional {"W": [V, P], "b": [V]} of a trained LM (for perplexity).
    vocab_file: optional vocabulary matching `softmax`.
    stateful: carry each batch row's LSTM state into the next batch (bilm-tf semantics); sentences are
      then processed in the given order, row k of each batch continuing row k of the previous one.
    dtype: matmul dtype (jnp.float32 or jnp.bfloat16).
  """

  def __init__(self, options: dict[str, Any], params: dict[str, Any], *, softmax: dict | None = None,
               vocab_file: str | None = None, stateful: bool = False, dtype: Any = jnp.float32):
    self.options = options
    self.config = BiLMConfig.from_options(options)
    self.params = jax.tree_util.tree_map(jnp.asarray, params)
    self.softmax = softmax
    self.vocab_file = vocab_file
    self.stateful = stateful
    self.model = BiLM(self.config, dtype=dtype)
    self._state = None
    self._cnn = jax.jit(lambda p, ids: self.model.apply({"params": p}, ids, method=BiLM.embed_tokens))
    self._bilm = jax.jit(lambda p, emb, mask, state: self.model.apply(
        {"params": p}, token_embeddings=emb, mask=mask, state=state))

  # --- construction -------------------------------------------------------------------------------------
  @classmethod
  def from_files(cls, options_file: str | os.PathLike, weight_file: str | os.PathLike, **kwargs) -> "Embedder":
    options = options_lib.load(options_file)
    loaded = weights_lib.load_hdf5(weight_file, options)
    return cls(options, loaded["params"], softmax=loaded["softmax"], **kwargs)

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, **kwargs) -> "Embedder":
    """A trained run: uses `workdir/export/{options.json,weights.hdf5}` and `workdir/vocab.txt`."""
    export = os.path.join(workdir, "export")
    for name in ("options.json", "weights.hdf5"):
      if not os.path.exists(os.path.join(export, name)):
        raise FileNotFoundError(f"{os.path.join(export, name)}: not found (has {workdir} finished a checkpoint?)")
    vocab = os.path.join(workdir, "vocab.txt")
    return cls.from_files(os.path.join(export, "options.json"), os.path.join(export, "weights.hdf5"),
                          vocab_file=vocab if os.path.exists(vocab) else None, **kwargs)

  @classmethod
  def random(cls, options: dict[str, Any], seed: int = 0, **kwargs) -> "Embedder":
    """Randomly initialised biLM (bilm-tf's initialisers) of the given shape."""
    options = options_lib.validate(options)
    model = BiLM(BiLMConfig.from_options(options))
    dummy = np.zeros((1, 1, options["char_cnn"]["max_characters_per_token"]), np.int32)
    params = model.init(jax.random.key(seed), dummy)["params"]
    return cls(options, params, **kwargs)

  def untrained_twin(self, seed: int = 0) -> "Embedder":
    """Same options, random init: the control for probing experiments."""
    return Embedder.random(self.options, seed=seed, stateful=self.stateful)

  # --- properties ---------------------------------------------------------------------------------------
  @property
  def n_layers(self) -> int:
    """Number of representation layers (LSTM layers + the token layer)."""
    return self.config.n_layers + 1

  @property
  def output_dim(self) -> int:
    return self.config.output_dim

  def reset_state(self) -> None:
    self._state = None

  # --- embedding ----------------------------------------------------------------------------------------
  def embed_batch(self, sentences: Sequence[Sequence[str]], pad_batch_to: int | None = None) -> np.ndarray:
    """One padded batch -> `[batch, n_layers + 1, time_bucket, 2P]` float32 (zeros past each length)."""
    n = len(sentences)
    rows = max(n, pad_batch_to or 0)
    time = bucket(max((len(s) for s in sentences), default=1) or 1)
    max_chars = self.config.max_characters_per_token
    index: dict[str, int] = {}
    positions = np.zeros((rows, time), np.int32)
    mask = np.zeros((rows, time), bool)
    for b, sentence in enumerate(sentences):
      for t, token in enumerate(sentence):
        positions[b, t] = index.setdefault(token, len(index))
        mask[b, t] = True
    ids = np.zeros((_pow2_at_least(len(index)), max_chars), np.int32)
    for token, i in index.items():
      ids[i] = chars.token_to_ids(token, max_chars)
    unique_emb = self._cnn(self.params, ids)  # [n_unique_bucket, P]
    emb = jnp.take(unique_emb, positions, axis=0)  # [rows, time, P]
    state = None
    if self.stateful:
      state = self._take_state(rows)
    out = self._bilm(self.params, emb, mask, state)
    if self.stateful:
      self._put_state(out["state"], n)
    return np.asarray(out["layers"][:n])

  def _take_state(self, rows: int):
    cfg = self.config
    if self._state is None or self._state[0].shape[2] < rows:
      grown = (np.zeros((cfg.n_layers, 2, rows, cfg.lstm_dim), np.float32),
               np.zeros((cfg.n_layers, 2, rows, cfg.projection_dim), np.float32))
      if self._state is not None:
        old = self._state[0].shape[2]
        grown[0][:, :, :old], grown[1][:, :, :old] = self._state
      self._state = grown
    return (self._state[0][:, :, :rows], self._state[1][:, :, :rows])

  def _put_state(self, state, n: int) -> None:
    # Only the rows that held sentences move on; unused rows keep their state (bilm-tf semantics).
    c, h = (np.array(s) for s in self._state)
    c[:, :, :n], h[:, :, :n] = np.asarray(state[0])[:, :, :n], np.asarray(state[1])[:, :, :n]
    self._state = (c, h)

  def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int = 64,
                      progress: Any = None) -> list[np.ndarray]:
    """Each sentence -> `(n_layers + 1, n_tokens, 2P)` float32, in input order.

    Stateless: sentences are sorted by length so batches hold similar lengths. Stateful: input order.
    `progress`, if given, is called with the number of sentences finished after each batch.
    `sentences` may be any iterable (a generator too) of token sequences.
    """
    sentences = _check_sentences(sentences, batch_size)
    order = list(range(len(sentences)))
    if not self.stateful:
      order.sort(key=lambda i: len(sentences[i]))
    results: list[np.ndarray | None] = [None] * len(sentences)
    done = 0
    for start in range(0, len(order), batch_size):
      chunk = order[start:start + batch_size]
      batch = [list(sentences[i]) for i in chunk]
      # A short last batch is padded to a power of two of rows, not to batch_size: it holds the longest
      # sentences, so full padding would dominate the cost; this adds at most log2(batch_size) shapes.
      rows = batch_size if self.stateful else min(batch_size, _pow2_at_least(len(chunk), floor=1))
      layers = self.embed_batch(batch, pad_batch_to=rows)
      for row, i in enumerate(chunk):
        results[i] = layers[row, :, :len(batch[row])]
      done += len(chunk)
      if progress is not None:
        progress(done)
    return results  # type: ignore[return-value]

  def __call__(self, sentences: Iterable[Sequence[str]], batch_size: int = 64) -> list[np.ndarray]:
    return self.embed_sentences(sentences, batch_size)
