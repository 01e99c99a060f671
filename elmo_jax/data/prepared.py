"""A prepared corpus (`elmo_jax.data.prepare`: type ids, the type table) opened for reading, as sentences of
type ids for the one batch iterator (`batches.LMIterator`). The same stream as `pipeline.make_lm_iterator`
on the raw text (same Grain index order, same batches, counters and `get_state()`), so a prepared run's
batches, losses and checkpoints equal the raw-text run's, for a fraction of the host time.
"""
from __future__ import annotations

import os
from typing import Callable

import grain
import numpy as np

from elmo_jax.runtime import log
from elmo_jax.runtime import storage
from elmo_jax.data.batches import LMIterator, stream_order
from elmo_jax.data.chars import is_cut
from elmo_jax.data.manifest import AGAIN, MANIFEST, PreparedCorpusError, open_verified
from elmo_jax.data.vocab import Vocab



class PreparedCorpus:
  """A prepared directory opened for reading: memory-mapped ids plus the type table.

  Opened through `manifest.open_verified` (manifest format, sizes, sha256 with its per-file cache; see
  there), then the arrays are checked against the manifest's counts. Nothing is written into the directory.

  Attributes:
    manifest: the directory's manifest.json.
    tokens: int32 [n_tokens] type ids (memory-mapped).
    offsets: int64 [n_sentences + 1].
    type_chars: int32 [n_types, C] char ids of every type.
    types: the type strings.

  Raises:
    manifest.NotPreparedError (a FileNotFoundError): no manifest.json.
    manifest.PreparedCorpusError (a PrepareError and an OSError): a damaged directory; one line naming the file.
  """

  def __init__(self, directory: str, *, checksums: bool = True, log_line: Callable[[str], None] = log.info):
    self.directory = os.path.abspath(storage.local(directory))  # a bucket's corpus: its local copy
    manifest = open_verified(self.directory, checksums=checksums, log_line=log_line)
    self.manifest = manifest
    self.settings = manifest["settings"]
    counts = manifest["counts"]
    self.tokens = self._load("tokens.npy", np.int32, (counts["n_tokens"],), mmap_mode="r")
    self.offsets = self._load("offsets.npy", np.int64, (counts["n_sentences"] + 1,))
    self.type_chars = self._load("type_chars.npy", np.uint16, None).astype(np.int32)
    path = os.path.join(self.directory, "types.txt")
    try:
      with open(path, encoding="utf-8") as f:
        self.types = f.read().split("\n")[:-1]
    except (OSError, UnicodeDecodeError) as e:
      raise PreparedCorpusError(f"{path} cannot be read ({str(e).splitlines()[0]}); {AGAIN}") from None
    n_types = counts["n_types"]
    if len(self.types) != n_types or self.type_chars.ndim != 2 or len(self.type_chars) != n_types:
      raise PreparedCorpusError(f"{self.directory}: types.txt has {len(self.types):,} types, type_chars.npy "
                                f"{len(self.type_chars):,}, {MANIFEST} counts {n_types:,}; {AGAIN}")
    if self.offsets[0] != 0 or self.offsets[-1] != counts["n_tokens"] or np.any(np.diff(self.offsets) < 0):
      raise PreparedCorpusError(f"{self.directory}/offsets.npy does not cut tokens.npy into sentences; {AGAIN}")
    width = self.settings["max_characters_per_token"]
    if self.type_chars.shape[1] != width:
      raise PreparedCorpusError(f"{self.directory}/type_chars.npy holds {self.type_chars.shape[1]} char ids per "
                                f"type, {MANIFEST} has settings.max_characters_per_token = {width}; {AGAIN}")
    self.lengths = np.diff(self.offsets).astype(np.int64)
    self.skipped = dict(manifest.get("skipped_lines", {}))
    limit = self.settings["max_token_chars"]
    # what the model's char ids cut (UTF-8 bytes past width - 2, `chars.is_cut`)
    self._truncated = np.fromiter((is_cut(t, width, limit) for t in self.types), bool, count=len(self.types))
    if "n_truncated_tokens" in counts:  # the type table is hashed, the manifest cannot be: they must agree
      type_counts = self._load("type_counts.npy", np.int64, (n_types,))
      found = int(type_counts[self._truncated].sum())
      by_chars = np.fromiter((len(t) > limit for t in self.types), bool, count=len(self.types))
      if counts["n_truncated_tokens"] not in (found, int(type_counts[by_chars].sum())):  # older manifests: chars
        raise PreparedCorpusError(
            f"{self.directory}/{MANIFEST} has settings.max_token_chars = {limit}, which cuts {found:,} tokens of "
            f"types.txt, but counts.n_truncated_tokens = {counts['n_truncated_tokens']:,} (the manifest was "
            f"edited after preparing?); {AGAIN}")

  def _load(self, name: str, dtype, shape: tuple[int, ...] | None, mmap_mode: str | None = None) -> np.ndarray:
    """One array of the directory, of the dtype (and shape) the manifest implies; else one line naming it."""
    path = os.path.join(self.directory, name)
    try:
      array = np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
      raise PreparedCorpusError(f"{path} is not a readable .npy array ({str(e).splitlines()[0][:120]}); "
                                f"{AGAIN}") from None
    if array.dtype != dtype or (shape is not None and array.shape != shape):
      raise PreparedCorpusError(f"{path} holds {array.dtype} {list(array.shape)}, {MANIFEST} implies "
                                f"{np.dtype(dtype)} {list(shape) if shape else '[n_types, C]'}; {AGAIN}")
    return array

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def vocab(self) -> Vocab:
    """The directory's softmax vocabulary (vocab.txt + vocab_counts.tsv, both hashed in the manifest)."""
    path = os.path.join(self.directory, "vocab.txt")
    try:
      vocab = Vocab.load(path)
    except (OSError, ValueError) as e:
      raise PreparedCorpusError(f"{path} cannot be read as a vocabulary ({str(e).splitlines()[0]}); {AGAIN}") from None
    counts = self.manifest["counts"]
    if (counts.get("vocab_size", len(vocab)) != len(vocab)
        or counts.get("vocab_sha256", vocab.sha256()) != vocab.sha256()):
      raise PreparedCorpusError(f"{path} holds {len(vocab):,} tokens (sha256 {vocab.sha256()[:12]}), {MANIFEST} "
                                f"records counts.vocab_size = {counts.get('vocab_size')}; {AGAIN}")
    return vocab

  def targets(self, vocab: Vocab) -> np.ndarray:
    """int32 [n_types]: the softmax id of each type (cut to max_token_chars like the raw path, OOV -> <UNK>)."""
    limit = self.settings["max_token_chars"]
    return vocab.encode([t[:limit] for t in self.types])

  def truncated(self) -> np.ndarray:
    """bool [n_types]: types the char ids cut (`chars.is_cut`; counted in `truncated_tokens`)."""
    return self._truncated.copy()

  def lexicon_chars(self, token_ids) -> np.ndarray:
    """int32 [n_types, 1 + max_chars]: every type's ids through an EFML-style model's lexicons
    (`lexicon.TokenIds`), cut to max_token_chars like the raw path; types 0 and 1 are `<S>` and `</S>`."""
    limit = self.settings["max_token_chars"]
    rows = [token_ids.bos, token_ids.eos] + [token_ids(t[:limit]) for t in self.types[2:]]
    return np.stack(rows).astype(np.int32)

  def type_counts(self) -> np.ndarray | None:
    """int64 [n_types]: each type's count in the corpus, where the directory has them."""
    try:
      return self._load("type_counts.npy", np.int64, (len(self.types),))
    except PreparedCorpusError:
      return None

  def sentence(self, index: int) -> list[str]:
    return [self.types[i] for i in self.tokens[self.offsets[index] : self.offsets[index + 1]]]


class _CorpusTypes:
  """`batches.SentenceTypes` of a prepared corpus under a vocabulary (the softmax ids of its types)."""
  stable_ids = True  # the corpus's own numbering

  def __init__(self, corpus: PreparedCorpus, vocab: Vocab, token_ids=None):
    self.corpus, self.skipped = corpus, corpus.skipped
    chars = corpus.type_chars if token_ids is None else corpus.lexicon_chars(token_ids)
    self._tables = (chars, corpus.targets(vocab), corpus.truncated())
    # A plain view of the memory map (nothing read): its slices skip np.memmap's per-slice bookkeeping.
    self._tokens, self._offsets = np.asarray(corpus.tokens), corpus.offsets

  def __len__(self) -> int:
    return len(self.corpus)

  def type_ids(self, index: int) -> np.ndarray:
    return self._tokens[self._offsets[index]:self._offsets[index + 1]]

  def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return self._tables


def make_prepared_iterator(corpus: PreparedCorpus, vocab: Vocab, *, batch_size: int, unroll_steps: int, seed: int,
                           shuffle: bool = True, num_epochs: int | None = None, process_index: int | None = None,
                           process_count: int | None = None, shard: str = "sentences",
                           dedupe_shards: int | None = None, dedupe_by: str = "type", token_ids=None,
                           types: "_CorpusTypes | None" = None) -> LMIterator:
  """`make_lm_iterator`'s arguments and stream, from a `PreparedCorpus` (tokenizer settings come from it);
  `token_ids`: an EFML-style model's (`lexicon.TokenIds`); `types`: the corpus's tables made once (`corpus_types`)."""
  settings = corpus.settings
  order, stride, first_row, config = stream_order(
      grain.MapDataset.range(len(corpus)), batch_size=batch_size, unroll_steps=unroll_steps, seed=seed,
      shuffle=shuffle, num_epochs=num_epochs, process_index=process_index, process_count=process_count,
      shard=shard, vocab=vocab, pretokenized=settings["tokenizer"]["pretokenized"],
      max_token_chars=settings["max_token_chars"], max_characters_per_token=settings["max_characters_per_token"])
  types = types or _CorpusTypes(corpus, vocab, token_ids)
  return LMIterator(types, order, config, batch_size, unroll_steps, stride, first_row, dedupe_shards, dedupe_by)


def corpus_types(corpus: PreparedCorpus, vocab: Vocab, token_ids=None) -> _CorpusTypes:
  """The type tables of `corpus` under `vocab` (and an EFML-style model's `token_ids`), to share among iterators."""
  return _CorpusTypes(corpus, vocab, token_ids)
