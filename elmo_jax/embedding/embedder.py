"""`Embedder`: sentences in, ELMo layers out (numpy), fast and with a bounded number of compiled shapes.

    emb = Embedder.from_files("options.json", "weights.hdf5")
    layers = emb.embed_sentences([["The", "bank", "flooded", "."]])  # [(n_layers + 1, 4, 2P) float32]

Speed: sentences are sorted by length and padded to a few time buckets (`host_batch`); every distinct token
runs through the char CNN once (exact: the CNN sees one token at a time), over fewer char positions when short
(`embed_step.char_widths`), in fixed chunks, into an on-device token table that outlives the batch
(`token_cache.TokenRows`); the biLM gathers its tokens from it in the same program. Batch k+1 is prepared and
dispatched before batch k is copied back. A warm Embedder (the default) compiles every shape at load, or reads it
from JAX's persistent compilation cache (`compile_cache`), so no call compiles. Every batch is split over this
process's devices (`devices=`; the programs are in `embed_step`); stateful, `row_state` keeps each row's state.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.data import chars
from elmo_jax.embedding import host_batch
from elmo_jax.embedding import long_sentence
from elmo_jax.embedding import row_state
from elmo_jax.embedding import step as embed_step
from elmo_jax.embedding import token_cache as token_cache_lib
from elmo_jax.embedding.args import check_batch_size, check_sentences, sentence_means
from elmo_jax.embedding.compile_cache import enable_compilation_cache
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import tfhub
from elmo_jax.model import BiLM, BiLMConfig
from elmo_jax.runtime import files
from elmo_jax.runtime import memory
from elmo_jax.sources import loaded
from elmo_jax.sources import resolve

# `malloc_trim` (10-100 ms): every 2,048 sentences across calls (as memory grows, docs/latency.md), after 8+ batches
_TRIM_EVERY_ROWS, _TRIM_AFTER_PASS = 2048, 8
_CNN_CACHE_TOKENS = 1 << 15
DEFAULT_BATCH_SIZE = 64  # sentences per device (stateless) or per batch (stateful: it defines the rows)


class Embedder:
  """Runs a `BiLM` over tokenized sentences.

  Args:
    options: options.json content.
    params: `BiLM` params (as `weights.load_hdf5` returns them).
    vocab_file: the vocabulary the model came with (a run's vocab.txt), an input outputs must not overwrite.
    stateful: carry each batch row's LSTM state into the next batch (bilm-tf semantics); sentences are then
      processed in the given order, row k of each batch continuing row k of the previous one.
    dtype: matmul dtype (jnp.float32 or jnp.bfloat16).
    token_embedding_file: char-CNN outputs of a vocabulary (`embed --dump_token_embeddings`): its words skip the CNN.
    token_vocab_file: the vocabulary of a bilm-tf token embedding file (ours store their words).
    compilation_cache: turn on JAX's persistent compilation cache (`enable_compilation_cache`).
    cnn_cache_tokens: char-CNN outputs kept on each device across batches (`token_cache.TokenRows`; small:
      16 MB, original: 64 MB at the default), so a token runs through the CNN once per device, not once per batch.
    devices: this process's devices to split each batch over (`embed_step.local_mesh`): None = all local devices,
      an int k = the first k, or a list. Rows are padded to a multiple of the device count; each device
      computes as a one-device Embedder would, so the outputs equal one device's.
    token_ids: token -> ids where not bilm-tf's UTF-8 bytes (an ELMoForManyLangs model's `chars.LexiconIds`).
    warm: compile at load every program a call runs (`warm_shapes`; from the persistent compilation cache when
      it has them), so no call compiles: time buckets `host_batch.WARM_TIME_BUCKETS`, batches up to
      `default_batch_size`, longer sentences in fixed stretches (`long_sentence`). False (scripts, the embed
      command): each shape compiles when first met, over `host_batch.TIME_BUCKETS`.
    batch_size: sentences per device in a batch (`default_batch_size`); fewer: fewer shapes to warm.
  """

  def __init__(self, options: dict[str, Any], params: dict[str, Any], *,
               vocab_file: str | None = None, stateful: bool = False, dtype: Any = jnp.float32,
               token_embedding_file: str | os.PathLike | None = None, token_vocab_file: str | None = None,
               compilation_cache: bool = True, cnn_cache_tokens: int = _CNN_CACHE_TOKENS,
               devices: int | Sequence[Any] | None = None, token_ids: chars.LexiconIds | None = None,
               warm: bool = True, batch_size: int = DEFAULT_BATCH_SIZE):
    check_batch_size(batch_size, f"Embedder(batch_size={batch_size!r})")  # at construction, not the first call
    if compilation_cache:
      enable_compilation_cache()
    self.options = options
    self.batch_size = batch_size
    self.config = BiLMConfig.from_options(options)
    self.mesh = embed_step.local_mesh(devices)
    self.vocab_file = vocab_file
    self.stateful = stateful
    self.model = BiLM(self.config, dtype=dtype)
    self._steps = embed_step.steps(self.model, self.mesh)
    self.params = jax.device_put(jax.tree_util.tree_map(jnp.asarray, params), self._steps.replicated)
    self.constants = self._steps.constants(self.params)  # made once, not in every call
    self._state = None
    self._fingerprint = None
    self._untrimmed = 0  # sentences run since the allocator's free pages were last handed back
    # LSTM row-steps of the packed batches so far: [run (rows x the fullest row's steps), needed (slots filled)]
    self.row_steps = [0, 0]
    self.token_ids = token_ids
    self._char_ids = chars.CharIdCache(self.config.max_characters_per_token, max_size=200_000, ids_of=token_ids)
    # what the char CNN's width cut must know of the ids (embed_step.char_widths)
    self._pad = {"pad_id": token_ids.pad_id, "lead": token_ids.lead} if token_ids is not None else {}
    self._max_width = max(w for w, _ in self.config.filters)
    pinned = np.zeros((0, self.config.projection_dim), np.float32)
    tokens = []
    if token_embedding_file is not None:  # its words are pinned rows of the table: they skip the char CNN
      pinned, tokens = token_cache_lib.read(token_embedding_file, self.config.projection_dim,
                                            token_vocab_file)
    # One table per device [devices, capacity, P] (embed_step), float32: the char CNN's output dtype
    # (float32 accumulation); the pinned rows start every device's table.
    self._token_rows = [token_cache_lib.TokenRows(cnn_cache_tokens, tokens) for _ in range(self.mesh.size)]
    self.token_embedding_file = None if token_embedding_file is None else os.fspath(token_embedding_file)
    self.model_files: tuple[str, ...] = ()  # the local options and weight files it was read from (from_files)
    self.module_mix: dict[str, np.ndarray] | None = None  # a TF-Hub module's `elmo` mix (from_model)
    self.extra_model_files: tuple[str, ...] = ()  # every other file of its model (`LoadedModel.input_files`)
    self._pinned = np.asarray(pinned, np.float32)
    self._table = self._new_table(self._pinned.shape[0])
    self.warm = warm
    self._time_buckets = host_batch.WARM_TIME_BUCKETS if warm else host_batch.TIME_BUCKETS
    if warm:
      self.warm_shapes()

  def _new_table(self, capacity: int) -> jax.Array:
    """Each device's table `[devices, capacity, P]`, the pinned rows first, built on the host (no compile)."""
    table = np.zeros((self.mesh.size, capacity, self.config.projection_dim), np.float32)
    table[:, :self._pinned.shape[0]] = self._pinned
    return self._steps.put_rows(table)

  def warm_shapes(self) -> None:
    """Compiles every program a call runs (or loads it from the persistent compilation cache): the char CNN
    at each width, and the biLM of each time bucket for each row count `batches` pads to with batch sizes
    up to `default_batch_size` (stateful too: a call of one sentence runs one row's LSTMs, not the state's
    `batch_size` rows)."""
    self._table = self._new_table(max(rows.capacity for rows in self._token_rows))
    batch = self.default_batch_size
    rows = sorted({embed_step.round_rows(min(batch, 1 << k), self.mesh) for k in range(batch.bit_length())})
    state = (lambda n: row_state.grown(None, self.config, n)) if self.stateful else None
    self._table = self._steps.warm(self.params, self.constants, self._table, rows, self._time_buckets,
                                   embed_step.widths(self.config.token_width), state, long_sentence.STRETCH,
                                   lambda n: row_state.grown(None, self.config, n))
    memory.release_free_memory()  # what compiling freed goes back in the load, not in a call's trim
    self._untrimmed = 0

  # --- construction -------------------------------------------------------------------------------------
  @classmethod
  def from_files(cls, options_file: str | os.PathLike, weight_file: str | os.PathLike, **kwargs) -> "Embedder":
    """Local paths, `file://` or `http(s)://` URLs (downloaded once into the cache, see `elmo_jax.sources.download`;
    a download must be a valid options.json and a readable HDF5 file, whatever the URL's name). An
    ELMoForManyLangs folder's config.json and a .pkl (what `resolve.resolve` gives for one): as `from_efml`."""
    return cls.from_model(resolve.resolve_files(options_file, weight_file), **kwargs)

  @classmethod
  def from_efml(cls, folder: str | os.PathLike, **kwargs) -> "Embedder":
    """An ELMoForManyLangs model folder (`formats/efml.py`): the same layers as its `sents2elmo(...,
    output_layer=-2)` gives for a batch it starts with a fresh state (see the README)."""
    return cls.from_model(resolve.efml_folder(folder), **kwargs)

  @classmethod
  def from_pretrained(cls, name_or_path: str, **kwargs) -> "Embedder":
    """A training run, a released model by name (`small`, `medium`, `original`, `original_5.5B`), a URL or a
    folder: options.json + weights.hdf5, or a TF-Hub `elmo/3`-layout module (`module_outputs` then gives its
    outputs) (`resolve.resolve_model`)."""
    return cls.from_model(resolve.resolve_model(name_or_path), **kwargs)

  @classmethod
  def from_workdir(cls, workdir: str | os.PathLike, **kwargs) -> "Embedder":
    """A trained run: uses `workdir/export/{options.json,weights.hdf5}` and `workdir/vocab.txt` (of a bucket
    workdir, `gs://...`, local copies of those)."""
    return cls.from_model(resolve.resolve_model(workdir, use="run"), **kwargs)

  @classmethod
  def from_model(cls, model: resolve.ResolvedModel, **kwargs) -> "Embedder":
    """What `resolve.resolve_model` found, read by `loaded.load_model` (the one load of every format); its
    vocabulary becomes one of its `input_files`, an EFML folder's char ids its `token_ids`."""
    # a bad batch size is refused before the load, not after it
    check_batch_size(kwargs.get("batch_size", 1), f"Embedder(batch_size={kwargs.get('batch_size')!r})")
    found = loaded.load_model(model)
    kwargs.setdefault("vocab_file", found.vocab_file)
    if found.token_ids is not None:
      kwargs.setdefault("token_ids", found.token_ids)
    emb = cls(found.options, found.params, **kwargs)
    emb.model_files = found.files[:2] if found.format == loaded.EFML else found.files  # what resolve names
    emb.extra_model_files = tuple(path for path in found.input_files if path not in emb.model_files)
    emb.module_mix = found.mix
    return emb

  @classmethod
  def random(cls, options: dict[str, Any], seed: int = 0, **kwargs) -> "Embedder":
    """Randomly initialised biLM (bilm-tf's initialisers) of the given shape."""
    options = options_lib.validate(options)
    model = BiLM(BiLMConfig.from_options(options))
    dummy = np.zeros((1, 1, model.config.token_width), np.int32)
    # one compiled program: run eagerly, init compiles every initializer and op of the forward on its own
    params = jax.jit(model.init)(jax.random.key(seed), dummy)["params"]
    return cls(options, params, **kwargs)

  def untrained_twin(self, seed: int = 0) -> "Embedder":
    """Same options, random init: the control for probing experiments."""
    return Embedder.random(self.options, seed=seed, stateful=self.stateful, devices=self.devices,
                           token_ids=self.token_ids, warm=self.warm)

  # --- properties ---------------------------------------------------------------------------------------
  @property
  def input_files(self) -> list[str]:
    """The files this embedder was read from (options, weights, vocabulary, token embeddings): what an
    output must never overwrite (`storage.check_output`)."""
    named = (*self.model_files, *self.extra_model_files, self.vocab_file, self.token_embedding_file)
    return [path for path in named if path]

  @property
  def n_layers(self) -> int:
    """Number of representation layers (LSTM layers + the token layer)."""
    return self.config.n_layers + 1

  @property
  def output_dim(self) -> int:
    return self.config.output_dim

  @property
  def devices(self) -> list[Any]:
    return list(self.mesh.devices.flat)

  @property
  def default_batch_size(self) -> int:
    """What `batch_size=None` means: `batch_size` (64) sentences per device, so each device gets the rows one
    device would; stateful, 64 whatever the devices (the batch rows are the state's rows, part of the result)."""
    return self.batch_size if self.stateful else self.batch_size * self.mesh.size

  def reset_state(self) -> None:
    self._state = None

  def clear_token_table(self) -> None:
    """Forgets the char-CNN outputs held for the tokens met so far (not a token embedding file's words):
    the batches that follow compute exactly what they would in a new Embedder."""
    for rows in self._token_rows:
      rows.reset()

  def fingerprint(self) -> str:
    """sha256 of what decides the outputs: options, params, matmul dtype, statefulness, pinned token rows
    (a resumable embedding job checks it)."""
    if self._fingerprint is None:
      pinned = np.asarray(self._table[0, :self._token_rows[0].pinned])
      self._fingerprint = files.sha256_arrays(
          *jax.tree_util.tree_leaves(self.params), pinned,
          extra={"options": self.options, "dtype": str(np.dtype(self.model.dtype)), "stateful": self.stateful,
                 **({} if self.token_ids is None else {"vocab": [self.token_ids.char2id, self.token_ids.word2id]})})
    return self._fingerprint

  @property
  def state(self):
    """Stateful use: the LSTMState `(c, h)` each batch row carries on (host arrays, `row_state`), None before
    the first batch."""
    return self._state

  @state.setter
  def state(self, value) -> None:  # e.g. the state a resumed job saved after its last finished part
    self._state = row_state.restored(value)

  # --- embedding ----------------------------------------------------------------------------------------
  def embed_batch(self, sentences: Sequence[Sequence[str]], pad_batch_to: int | None = None) -> np.ndarray:
    """One padded batch -> `[batch, n_layers + 1, time_bucket, 2P]` float32 (zeros past each length)."""
    if any(map(self._is_long, sentences)):
      raise ValueError(f"embed_batch takes sentences of at most {self._time_buckets[-1]} tokens; embed_sentences any")
    prepared = self._prepare(sentences, pad_batch_to)
    return np.asarray(self._launch(prepared))[:prepared.n]

  def _is_long(self, sentence: Sequence[str]) -> bool:  # run in stretches (`long_sentence`), not in a batch
    return self.warm and len(sentence) > self._time_buckets[-1]

  def _embed_long(self, sentence: Sequence[str], row: int) -> np.ndarray:
    """A long sentence -> `[n_layers + 1, n, 2P]`; stateful, it continues batch row `row`'s state."""
    prepared = self._prepare([sentence], None, bounded=False)  # its tokens through the CNN as a batch of it alone
    self._write_new_tokens(prepared)
    layers, state = long_sentence.embed(self._steps, self.params, self.constants, self._table,
                                        prepared.positions[0, :len(sentence)], self.config,
                                        self._state if self.stateful else None, row)
    self._state = state
    return layers

  def _prepare(self, sentences: Sequence[Sequence[str]], pad_batch_to: int | None,
               packing: Sequence[Sequence[int]] | None = None, bounded: bool | None = None) -> host_batch.Prepared:
    """Host side of a batch (`host_batch.prepare`), each device's rows against its own token table. `packing`:
    the rows' sentences (`host_batch.pack`); None: one sentence a row, laid between its boundaries for the
    stateless program unless `bounded` is False (the stateful program's form; default: stateless)."""
    if packing is None and (not self.stateful if bounded is None else bounded):
      packing = [[i] for i in range(len(sentences))]
    rows = embed_step.round_rows(max(len(sentences) if packing is None else len(packing), pad_batch_to or 0),
                                 self.mesh)
    return host_batch.prepare(sentences, rows, self._token_rows, self._char_ids, self._time_buckets,
                              self._max_width, self._pad, packing)

  def _write_new_tokens(self, prepared: host_batch.Prepared) -> None:
    """The batch's new tokens through the char CNN into the table (on device). Runs right after the batch's
    `_prepare` (whose row assignment it writes), as `batches` does."""
    capacity = max(rows.capacity for rows in self._token_rows)
    if capacity > self._table.shape[1]:  # first use, or a batch with more new tokens than a table held:
      self._table = self._new_table(capacity)  # the rows assigned so far were just cleared (`TokenRows`)
    put = self._steps.put_rows
    for chunk, dest in zip(prepared.chunks, prepared.dests):
      self._table = self._steps.cnn_into(self.params, self._table, put(chunk), put(dest))

  def _launch(self, prepared: host_batch.Prepared) -> jax.Array:
    """Dispatches a prepared batch (asynchronously); returns the device array of its layers."""
    self._write_new_tokens(prepared)
    positions = self._steps.put_rows(prepared.positions)
    if not self.stateful:
      return self._steps.layers(self.params, self.constants, self._table, positions)
    n_rows = prepared.positions.shape[0]
    self._state = row_state.grown(self._state, self.config, n_rows)
    state = jax.device_put(row_state.first_rows(self._state, n_rows), self._steps.state_sharding)
    layers, state = self._steps.layers_stateful(self.params, self.constants, self._table, positions, state)
    self._state = row_state.advanced(self._state, state, prepared.n)  # the rows that held sentences move on
    return layers

  def batches(self, sentences: Sequence[Sequence[str]], batch_size: int | None = None, *,
              full_rows: bool = False, skip: Callable[[int], bool] | None = None,
              fresh_every: int | None = None) -> Iterator[tuple[int, list[int], np.ndarray, Any]]:
    """Yields (k, indices into `sentences`, layers, stateful: the state right after batch k, else None) batch by
    batch; batches with `skip(k)` are neither run nor yielded (a resumed job's finished parts). Layers: stateful,
    `[len(indices), n_layers + 1, time, 2P]` (row r: sentence r, zeros past its length); stateless, and a batch that
    holds a sentence past a warm Embedder's longest time bucket, a list of one `[n_layers + 1, n, 2P]` array per
    sentence (`layers[row][:, :n]` reads either form).

    Stateless: sentences sorted by length (stable), so batches hold similar lengths, and each batch's sentences
    packed end to end into as few rows as pay (`host_batch.pack`; the LSTMs start afresh at each sentence): a
    batch of unlike lengths (a short input, a server's requests) runs about the steps its tokens need, not its
    longest sentence's in every row. Stateful: one sentence a row (the row's state is its own), input order, row k
    of a batch continuing row k of the one before. Batches hold `batch_size` sentences (None: `default_batch_size`);
    a short last batch is padded to a power of two of rows, not to batch_size (stateless, it holds the longest
    sentences, so full padding would dominate its cost; stateful, the rows past it keep their state and are not
    run; at most log2(batch_size) more shapes), unless `full_rows`. Batch k+1 is prepared and dispatched before
    batch k is fetched, so the host's work (and the caller's, e.g. writing batch k) overlaps the device's.
    `fresh_every=m`: the token table is cleared before batches 0, m, 2m, ..., so each group of m batches gives
    the same bits whatever ran before it (XLA:CPU's matmuls round a row by where it sits in its chunk, ~1e-7, so
    a token's char-CNN output depends on the tokens it was first computed with)."""
    batch_size = batch_size or self.default_batch_size
    order = list(range(len(sentences)))
    if not self.stateful:
      order.sort(key=lambda i: len(sentences[i]))

    def padded_rows(n: int) -> int:  # a short last batch: a power of two of rows, unless `full_rows`
      return batch_size if full_rows else min(batch_size, 1 << max(0, n - 1).bit_length())

    pending = None
    for k, start in enumerate(range(0, len(order), batch_size)):
      if skip is not None and skip(k):
        continue
      if fresh_every and k % fresh_every == 0:
        self.clear_token_table()
      chunk = order[start:start + batch_size]
      self._untrimmed += len(chunk)
      self._release_memory_after(_TRIM_EVERY_ROWS)
      long = [self._is_long(sentences[i]) for i in chunk]  # their rows run empty here (a state stays as it was)
      in_batch = [[] if is_long else sentences[i] for i, is_long in zip(chunk, long)]
      packing = None
      if not self.stateful:
        packing = host_batch.pack([len(s) for s in in_batch], self._time_buckets[-1] + 2,
                                  lambda n: embed_step.round_rows(padded_rows(n), self.mesh))
      prepared = self._prepare(in_batch, padded_rows(len(chunk) if packing is None else len(packing)), packing)
      if packing is not None:
        self._count_steps(prepared)
      launched = (k, chunk, in_batch, packing, self._launch(prepared), self._state)
      if pending is not None:
        yield self._fetched(*pending)
      pending = launched
      if any(long):
        layers = self._fetched(*launched)[2]
        yield k, chunk, [self._embed_long(sentences[i], row) if long[row] else layers[row]
                         for row, i in enumerate(chunk)], self._state
        pending = None
    if pending is not None:
      yield self._fetched(*pending)
    self._release_memory_after(1 if len(order) >= _TRIM_AFTER_PASS * batch_size else _TRIM_EVERY_ROWS)

  @staticmethod
  def _fetched(k: int, chunk: list[int], in_batch: list[Sequence[str]], packing: list[list[int]] | None,
               layers: jax.Array, state: Any) -> tuple[int, list[int], Any, Any]:
    """A launched batch as `batches` yields it: its layers copied to the host; packed, one array per sentence
    (`host_batch.unpack`)."""
    layers = np.asarray(layers)
    if packing is None:
      return k, chunk, layers[:len(chunk)], state
    return k, chunk, host_batch.unpack(layers, packing, [len(s) for s in in_batch]), state

  def _count_steps(self, prepared: host_batch.Prepared) -> None:
    """`row_steps` of a packed batch: rows x its fullest row's steps, and the slots its sentences fill."""
    filled = (prepared.positions != -1).sum(axis=1)
    self.row_steps[0] += prepared.positions.shape[0] * int(filled.max())
    self.row_steps[1] += int(filled.sum())

  def _release_memory_after(self, every: int) -> None:
    """Hands the allocator's free pages back (`memory.release_free_memory`, 10-100 ms) once `every` sentences
    have run since it last did."""
    if self._untrimmed >= every:
      memory.release_free_memory()
      self._untrimmed = 0

  def embed_sentences(self, sentences: Sequence[Sequence[str]], batch_size: int | None = None,
                      progress: Any = None) -> list[np.ndarray]:
    """Each sentence -> `(n_layers + 1, n_tokens, 2P)` float32, in input order.

    Stateless: sentences are sorted by length so batches hold similar lengths. Stateful: input order.
    `progress`, if given, is called with the number of sentences finished after each batch.
    `sentences` may be any iterable (a generator too) of token sequences.
    """
    batch_size = self.default_batch_size if batch_size is None else batch_size
    sentences = check_sentences(sentences, batch_size)
    results: list[np.ndarray | None] = [None] * len(sentences)
    done = 0
    for _, chunk, layers, _ in self.batches(sentences, batch_size):
      for row, i in enumerate(chunk):
        # a batch row is copied (a view keeps the padded batch alive); a long sentence's own array is kept as is
        own = layers[row].base is None and layers[row].shape[1] == len(sentences[i])
        results[i] = layers[row] if own else np.array(layers[row][:, :len(sentences[i])])
      done += len(chunk)
      if progress is not None:
        progress(done)
    return results  # type: ignore[return-value]

  def __call__(self, sentences: Iterable[Sequence[str]], batch_size: int | None = None) -> list[np.ndarray]:
    return self.embed_sentences(sentences, batch_size)

  # --- sentence vectors and token caches ----------------------------------------------------------------
  def module_outputs(self, sentences: Sequence[Sequence[str]], batch_size: int | None = None
                     ) -> list[dict[str, np.ndarray]]:
    """A TF-Hub module's outputs of each sentence (`tfhub.output`): `word_emb` [n_tokens, P],
    `lstm_outputs1`/`lstm_outputs2` [n_tokens, 2P], and with a module's mix `elmo` [n_tokens, 2P] and
    `default` [2P]."""
    return [tfhub.outputs(layers, self.module_mix) for layers in self.embed_sentences(sentences, batch_size)]

  def sentence_vectors(self, sentences: Sequence[Sequence[str]], layer: str | int | Sequence[float] = "all",
                       batch_size: int | None = None) -> np.ndarray:
    """One vector per sentence: the mean over its tokens (padding never enters; no tokens: zeros).

    Args:
      layer: "all" -> `[n, n_layers + 1, 2P]`; "top" / "average" / an int layer k / a weight per layer
        (e.g. a learned scalar mix's `gamma * softmax(w)`) -> `[n, 2P]`.
    """
    sentences = check_sentences(sentences, self.default_batch_size if batch_size is None else batch_size,
                                "sentence_vectors")
    return sentence_means(self.embed_sentences(sentences, batch_size), layer, self.n_layers, self.output_dim)

  def token_embeddings(self, tokens: Sequence[str], batch_size: int = 4096,
                       on_batch: Callable[[int], Any] | None = None) -> np.ndarray:
    """The char-CNN output of each token, `[len(tokens), P]` float32 (`token_cache.char_cnn_outputs`)."""
    return token_cache_lib.char_cnn_outputs(self._steps, self.params, self.config.projection_dim, self._char_ids,
                                            tokens, batch_size, on_batch, self._max_width, self._pad)

  def dump_token_embeddings(self, vocab: Sequence[str], output_file: str | os.PathLike,
                            batch_size: int = 4096) -> None:
    """Writes the char-CNN output of every word (bilm-tf's `dump_token_embeddings` layout + the words);
    `files.UnsafeOutputError` first when `output_file` is one of the embedder's own files."""
    token_cache_lib.dump(self.token_embeddings, list(vocab), output_file, batch_size, self.input_files)
