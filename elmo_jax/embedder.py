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
from elmo_jax import download
from elmo_jax import options as options_lib
from elmo_jax import pretrained
from elmo_jax import token_cache as token_cache_lib
from elmo_jax import weights as weights_lib
from elmo_jax.model import BiLM, BiLMConfig, embed_vocab
from elmo_jax.progress import progress

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
    token_embedding_file: char-CNN outputs of a vocabulary (`python -m elmo_jax.embed
      --dump_token_embeddings`); its words skip the char CNN, other words still run through it.
    token_vocab_file: the vocabulary of a bilm-tf token embedding file (ours store their words).
  """

  def __init__(self, options: dict[str, Any], params: dict[str, Any], *, softmax: dict | None = None,
               vocab_file: str | None = None, stateful: bool = False, dtype: Any = jnp.float32,
               token_embedding_file: str | os.PathLike | None = None, token_vocab_file: str | None = None):
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
    self._token_rows: dict[str, int] | None = None
    if token_embedding_file is not None:
      table, tokens = token_cache_lib.read(token_embedding_file, self.config.projection_dim,
                                           token_vocab_file)
      self._token_rows = {t: i for i, t in enumerate(tokens)}
      self._token_table = jnp.asarray(table)
      self._mix = jax.jit(lambda table, rows, hit, cnn, cnn_rows: jnp.where(
          hit[:, None], jnp.take(table, rows, axis=0), jnp.take(cnn, cnn_rows, axis=0)))

  # --- construction -------------------------------------------------------------------------------------
  @classmethod
  def from_files(cls, options_file: str | os.PathLike, weight_file: str | os.PathLike, **kwargs) -> "Embedder":
    """Local paths, `file://` or `http(s)://` URLs (downloaded once into the cache, see `elmo_jax.download`)."""
    options = options_lib.load(download.cached_path(options_file))
    loaded = weights_lib.load_hdf5(download.cached_path(weight_file), options)
    return cls(options, loaded["params"], softmax=loaded["softmax"], **kwargs)

  @classmethod
  def from_pretrained(cls, name_or_path: str, **kwargs) -> "Embedder":
    """A released model by name (`small`, `medium`, `original`, `original_5.5B`), a folder or a URL."""
    if os.path.isdir(os.path.expanduser(name_or_path)) and os.path.isdir(
        os.path.join(os.path.expanduser(name_or_path), "export")):
      return cls.from_workdir(os.path.expanduser(name_or_path), **kwargs)
    return cls.from_files(*pretrained.resolve(name_or_path), **kwargs)

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
    if self._token_rows is not None:
      unique_emb = self._cached_embeddings(list(index))
    else:
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

  def _cached_embeddings(self, tokens: list[str]) -> jax.Array:
    """`[pow2 >= len(tokens), P]`: rows of the token table for cached words, the char CNN for the rest."""
    n = _pow2_at_least(len(tokens))
    rows, hit, cnn_rows = np.zeros(n, np.int32), np.zeros(n, bool), np.zeros(n, np.int32)
    missing: list[str] = []
    for i, token in enumerate(tokens):
      row = self._token_rows.get(token)
      if row is None:
        cnn_rows[i] = len(missing)
        missing.append(token)
      else:
        rows[i], hit[i] = row, True
    max_chars = self.config.max_characters_per_token
    ids = np.zeros((_pow2_at_least(len(missing), floor=8), max_chars), np.int32)
    for i, token in enumerate(missing):
      ids[i] = chars.token_to_ids(token, max_chars)
    cnn = self._cnn(self.params, ids) if missing else jnp.zeros((1, self.config.projection_dim))
    return self._mix(self._token_table, rows, hit, cnn, cnn_rows)

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

  # --- sentence vectors and token caches ----------------------------------------------------------------
  def sentence_vectors(self, sentences: Sequence[Sequence[str]], layer: str | int | Sequence[float] = "all",
                       batch_size: int = 64) -> np.ndarray:
    """One vector per sentence: the mean over its tokens (padding never enters; no tokens: zeros).

    Args:
      layer: "all" -> `[n, n_layers + 1, 2P]`; "top" / "average" / an int layer k / a weight per layer
        (e.g. a learned scalar mix's `gamma * softmax(w)`) -> `[n, 2P]`.
    """
    sentences = list(sentences)
    shape = select_layers(np.zeros((self.n_layers, 1, self.output_dim), np.float32), layer)[..., 0, :].shape
    out = np.zeros((len(sentences),) + shape, np.float32)
    for i, layers in enumerate(self.embed_sentences(sentences, batch_size)):
      if layers.shape[1]:  # unpadded per sentence, so the mean sees only its real tokens
        out[i] = select_layers(layers, layer).mean(axis=-2, dtype=np.float64)
    return out

  def dump_token_embeddings(self, vocab: Sequence[str], output_file: str | os.PathLike,
                            batch_size: int = 1024) -> None:
    """Writes the char-CNN output of every word (bilm-tf's `dump_token_embeddings` layout + the words)."""
    bar = progress(desc="token embeddings", total=len(vocab), unit="word")
    try:
      table = embed_vocab(self.config, self.params, list(vocab), batch_size, self.model.dtype, bar.update)[1:]
    finally:
      bar.close()
    token_cache_lib.write(output_file, table, vocab)


def select_layers(layers: np.ndarray, layer: str | int | Sequence[float]) -> np.ndarray:
  """`[n_layers + 1, time, 2P]` -> the chosen output: all, top, average, layer k or a weighted sum."""
  if isinstance(layer, str):
    if layer == "all":
      return layers
    if layer == "top":
      return layers[-1]
    if layer == "average":
      return layers.mean(axis=0)
    raise ValueError(f"layer must be 'all', 'top', 'average', an int or weights, got {layer!r}")
  if isinstance(layer, (int, np.integer)):
    return layers[layer]
  weights = np.asarray(layer, np.float32)
  if weights.shape != layers.shape[:1]:
    raise ValueError(f"{len(weights)} layer weights for {layers.shape[0]} layers")
  return np.tensordot(weights, layers, axes=(0, 0))
