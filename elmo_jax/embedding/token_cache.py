"""Token embedding files: the char-CNN output of a vocabulary, precomputed (bilm-tf's `dump_token_embeddings`).

Layout: `embedding` `[n_words, P]` float32 in vocabulary order, as bilm-tf writes it (bilm-tf reads the
words from its vocab file), plus `tokens` `[n_words]` (variable-length strings) so the file stands alone.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import h5py
import numpy as np

from elmo_jax.data.vocab import Vocab
from elmo_jax.embedding import step as embed_step
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime.progress import progress


class TokenCacheError(ValueError):
  """A token embedding file that cannot be used; the message names the file."""


def write(path: str | os.PathLike, table: np.ndarray, tokens: Sequence[str]) -> None:
  if table.shape[0] != len(tokens):
    raise ValueError(f"{len(tokens)} tokens but {table.shape[0]} embeddings")
  with files.atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
    f.create_dataset("embedding", data=np.asarray(table, np.float32))
    f.create_dataset("tokens", data=list(tokens), dtype=h5py.string_dtype())


def read(path: str | os.PathLike, dim: int, vocab_file: str | None = None) -> tuple[np.ndarray, list[str]]:
  """(table `[n_words, dim]` float32, words). A bilm-tf file has no `tokens`: pass its `vocab_file`."""
  path = os.fspath(path)
  if not os.path.exists(path):
    raise TokenCacheError(f"{path}: token embedding file not found")
  try:
    with h5py.File(path, "r") as f:
      if "embedding" not in f:
        raise TokenCacheError(f"{path}: no 'embedding' dataset (not a token embedding file)")
      table = np.asarray(f["embedding"][...], np.float32)
      tokens = list(f["tokens"].asstr()[...]) if "tokens" in f else None
  except OSError as e:
    raise TokenCacheError(f"{path}: not a readable HDF5 file ({e})") from None
  if tokens is None:
    if vocab_file is None:
      raise TokenCacheError(f"{path}: no 'tokens' dataset (a bilm-tf file?); pass the vocab file it was "
                            "made from")
    tokens = Vocab.load(vocab_file, require_specials=False).tokens
  if table.ndim != 2 or table.shape != (len(tokens), dim):
    raise TokenCacheError(f"{path}: 'embedding' has shape {table.shape}, expected ({len(tokens)}, {dim}) "
                          "(made with another model or vocabulary?)")
  return table, tokens


class TokenRows:
  """Which row of a `[capacity, P]` table of char-CNN outputs holds each token (host bookkeeping).

  The `Embedder` keeps the table on device across batches, so a token runs through the char CNN once, not
  once per batch it appears in (exact: the CNN sees one token at a time). Pinned rows (a token embedding
  file's words) stay; the others fill as new tokens arrive and are all dropped at once when the table is
  full: frequent words come straight back, and nothing is tracked per use. A batch with more new tokens
  than the table holds grows it.
  """

  def __init__(self, capacity: int, pinned: Sequence[str] = ()):
    self.pinned = len(pinned)
    self._pinned_rows = {t: i for i, t in enumerate(pinned)}
    self.rows = dict(self._pinned_rows)
    self.capacity = self._initial_capacity = self.pinned + max(1, capacity)

  def clear(self) -> None:
    """Forgets every row but the pinned ones (their values stay in the table)."""
    self.rows = dict(self._pinned_rows)

  def reset(self) -> None:
    """`clear`, and the capacity back to its first value: what follows is assigned as in a new table."""
    self.clear()
    self.capacity = self._initial_capacity

  def assign(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct `tokens` -> (their rows `[U]`, the indices into `tokens` whose rows must be computed)."""
    new = [i for i, t in enumerate(tokens) if t not in self.rows]
    if len(self.rows) + len(new) > self.capacity:
      self.clear()
      new = [i for i, t in enumerate(tokens) if t not in self.rows]
      if self.pinned + len(new) > self.capacity:
        self.capacity = self.pinned + (1 << (len(new) - 1).bit_length())
    for i in new:
      self.rows[tokens[i]] = len(self.rows)
    return np.array([self.rows[t] for t in tokens], np.int32), np.array(new, np.int64)


def char_cnn_outputs(steps: embed_step.Steps, params: Any, dim: int, char_ids: Any, tokens: Sequence[str],
                     batch_size: int, on_batch: Callable[[int], Any] | None, max_width: int,
                     pad: dict[str, int]) -> np.ndarray:
  """The char-CNN output of each token, `[len(tokens), P]` float32, through an `Embedder`'s `steps` (the token
  table's path: by char width, in chunks), a fresh table of `batch_size` rows at a time; `on_batch(n_tokens)`
  after each (progress). `dim`: P; `char_ids`: the Embedder's `chars.CharIdCache` (a vocabulary's words are
  not kept in it); `max_width`, `pad`: `width_chunks`'."""
  out = np.zeros((len(tokens), dim), np.float32)
  n_dev, put = steps.mesh.size, steps.put_rows
  per_device = -(-batch_size // n_dev)
  for start in range(0, len(tokens), batch_size):
    part = tokens[start:start + batch_size]
    shares = [part[d * per_device:(d + 1) * per_device] for d in range(n_dev)]  # device d's tokens
    table = put(np.zeros((n_dev, per_device, dim), np.float32))
    chunks = [embed_step.width_chunks(char_ids.many(share, keep=False), np.arange(len(share), dtype=np.int32),
                                      max_width, **pad) for share in shares]
    for ids, dest in zip(*embed_step.stack_chunks(chunks)):
      table = steps.cnn_into(params, table, put(ids), put(dest))
    out[start:start + len(part)] = np.concatenate([t[:len(sh)] for t, sh in zip(np.asarray(table), shares)])
    if on_batch is not None:
      on_batch(len(part))
  return out


def dump(embed: Callable[..., np.ndarray], vocab: list[str], output_file: str | os.PathLike, batch_size: int,
         inputs: Sequence[str]) -> None:
  """`embed(tokens, batch_size, on_batch)` (`Embedder.token_embeddings`) of every word of `vocab`, written to
  `output_file` (`write`) with a progress bar; refused first when `output_file` is one of `inputs`."""
  storage.check_output(output_file, "output_file", inputs=inputs)
  bar = progress(desc="token embeddings", total=len(vocab), unit="word")
  try:
    table = embed(vocab, batch_size, bar.update)
  finally:
    bar.close()
  write(output_file, table, vocab)
