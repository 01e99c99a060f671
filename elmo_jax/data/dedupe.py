"""Train-time token dedupe for the char CNN: each distinct token of a data shard is embedded once.

The char CNN maps one token at a time, so running it on every position of both windows repeats the same
work for every recurring token ("the", ",", "<S>", ...). On the host we replace `fwd_chars`/`bwd_chars` by
a table of distinct tokens and per-position indices into it; the model embeds the table and gathers
(`BiLM.lm_windows(..., token_chars=, fwd_index=, bwd_index=)`). The result is exactly the same embeddings.

The table is built per data shard (the rows one device holds), not per batch: a replicated table of the
whole batch's tokens would make every device run the CNN on every token of the batch. `token_chars` is
[n_shards, U, max_chars] and is split along axis 0 over the same "data" mesh axis as the batch rows, so
device k holds exactly the table its rows index. Row 0 of every table is the all-zero "no token" row
(padding maps there and gets the zero embedding). U is rounded up to a few bucket sizes to bound recompiles.
"""
from __future__ import annotations

import numpy as np

_MIN_BUCKET = 64


def bucket_size(n: int, cap: int) -> int:
  """The smallest of 64, 96, 128, 192, 256, 384, ... (2^k and 3 * 2^(k-1)) >= n, at most `cap`.

  Wastes < 1/3 of the table on padding with only ~2 shapes per doubling of U, so a run compiles a
  handful of step variants at most (U of a fixed batch shape is concentrated in one or two buckets).
  """
  size = _MIN_BUCKET
  while size < n:
    size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
  return max(min(size, cap), n)


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Distinct rows of `rows` [n, c] (all-zero row first, always present) and each row's index."""
  rows = np.ascontiguousarray(np.concatenate([np.zeros((1, rows.shape[1]), rows.dtype), rows]))
  # One opaque bytes value per row: a 1-D unique (sort) instead of np.unique(axis=0)'s lexsort.
  keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
  _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
  table = rows[first]
  # memcmp order puts the all-zero bytes first; with int32 chars >= 0 it is the zero token.
  assert not table[0].any(), "the all-zero row must sort first"
  return table, inverse.reshape(-1)[1:]


def dedupe_batch(batch: dict[str, np.ndarray], n_shards: int, table_size: int | None = None
                 ) -> dict[str, np.ndarray]:
  """`fwd_chars`/`bwd_chars` [B, T, C] -> `token_chars` [n_shards, U, C], `fwd_index`/`bwd_index` [B, T].

  Rows are split into `n_shards` consecutive chunks (the data-parallel split of this process's rows);
  chunk k's indices point into `token_chars[k]`. Other keys pass through unchanged.

  Args:
    batch: an LM batch (`make_lm_iterator`'s layout).
    n_shards: how many devices this process's rows are split over.
    table_size: U to use (must be >= every chunk's distinct tokens + 1); None = bucketed from this batch.
  """
  n_chars = batch["fwd_chars"].shape[-1]
  unique = lambda chars: _unique_rows(chars.reshape(-1, n_chars))
  out = {k: v for k, v in batch.items() if k not in ("fwd_chars", "bwd_chars")}
  out.update(_shard_tables(batch["fwd_chars"], batch["bwd_chars"], n_shards, unique, table_size))
  return out


def _shard_tables(fwd: np.ndarray, bwd: np.ndarray, n_shards: int, unique, table_size: int | None
                  ) -> dict[str, np.ndarray]:
  """Per-shard tables from `unique(shard's fwd + bwd) -> (table [n, C] with the empty row 0, inverse)`."""
  rows, time = fwd.shape[:2]
  if rows % n_shards:
    raise ValueError(f"{rows} batch rows do not split over {n_shards} shards")
  r = rows // n_shards
  tables, fwd_index, bwd_index = [], np.empty((rows, time), np.int32), np.empty((rows, time), np.int32)
  for k in range(n_shards):
    sl = slice(k * r, (k + 1) * r)
    table, inverse = unique(np.concatenate([fwd[sl], bwd[sl]]))
    tables.append(table)
    fwd_index[sl], bwd_index[sl] = inverse.reshape(2, r, time)
  needed = max(len(t) for t in tables)
  u = bucket_size(needed, cap=2 * r * time + 1) if table_size is None else table_size
  if u < needed:
    raise ValueError(f"table_size {u} < {needed} distinct tokens (incl. the empty one) in a shard")
  token_chars = np.zeros((n_shards, u, tables[0].shape[1]), np.int32)
  for k, t in enumerate(tables):
    token_chars[k, :len(t)] = t
  return {"token_chars": token_chars, "fwd_index": fwd_index, "bwd_index": bwd_index}


def distinct_tokens(batch: dict[str, np.ndarray]) -> int:
  """Distinct real tokens of a deduped batch (over all its shards, excluding the empty row)."""
  return int(sum(np.count_nonzero(t.any(axis=-1)) for t in batch["token_chars"]))


def dedupe_type_ids(fwd_types: np.ndarray, bwd_types: np.ndarray, type_chars: np.ndarray, n_shards: int,
                    table_size: int | None = None) -> dict[str, np.ndarray]:
  """`dedupe_batch` from type ids ([B, T] each, -1 = padding) and the type table `type_chars` [n_types, C].

  Distinct types instead of distinct char rows (a prepared corpus knows them): no [B, T, C] arrays and no
  byte hashing. Two types with the same chars (cut long tokens) get two rows with equal embeddings, so the
  model's output is the same as `dedupe_batch`'s.
  """
  zero = np.zeros((1, type_chars.shape[1]), type_chars.dtype)

  def unique(ids: np.ndarray):
    # -1 (padding) sorts first: prepending one makes index 0 the empty row whether or not the shard pads.
    uniq, inverse = np.unique(np.concatenate([[-1], ids.reshape(-1)]), return_inverse=True)
    return np.concatenate([zero, type_chars[uniq[1:]]]), inverse.reshape(-1)[1:]

  return _shard_tables(fwd_types, bwd_types, n_shards, unique, table_size)
