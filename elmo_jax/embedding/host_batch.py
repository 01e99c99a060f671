"""The host side of an `Embedder` batch: sentences packed into rows (`pack`) and their layers cut out of the rows
again (`unpack`), time buckets, token positions against each device's token table, and the char ids of the tokens
the table does not hold yet, cut into the char CNN's fixed chunks."""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from elmo_jax.embedding import step as embed_step

TIME_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
# A warm Embedder's (compiled at load): fewer, so loading compiles fewer programs. The biLSTM runs only the
# steps of the longest row, one fused matmul per step, so a wider bucket costs little and changes no bit.
WARM_TIME_BUCKETS = (32, 128, 512)


def bucket(n: int, buckets: Sequence[int] = TIME_BUCKETS) -> int:
  """Smallest bucket >= n; beyond the table, the next multiple of the largest bucket."""
  for b in buckets:
    if n <= b:
      return b
  top = buckets[-1]
  return -(-n // top) * top


# What one step of a batch costs beyond its rows' work, in rows: the LSTM weights' read (a step of a few rows is
# bound by it; for `small` on 2 CPU cores a step's fixed part costs about what six more rows do). The packer's
# measure of a batch: steps x (rows + STEP_ROWS).
STEP_ROWS = 6
_CAPACITY_FACTORS = (1, 1.05, 1.1, 1.2, 1.35, 1.5, 2)  # a row's slots tried, times the least that could do


def pack(lengths: Sequence[int], max_slots: int, round_rows: Callable[[int], int]) -> list[list[int]]:
  """One batch's sentences of `lengths` tokens (no more than its rows), laid end to end into rows: each row the
  indices of the sentences it holds, in order; an empty sentence is laid nowhere. A sentence takes its tokens + 2
  slots (its `<S>` and `</S>`), a row at most `max_slots` (or the longest sentence's, if more); the batch runs as
  `round_rows(rows)` rows for as many steps as its fullest row holds.

  For each row count the batch may run as, the shortest rows that hold it in that many: longest first, best fit
  (each sentence into the row it fills most, a new row where none has room) into rows from the least length that
  could do (the longest sentence's, or the slots over the rows) up by a few steps. Of those, the packing that costs
  least (steps x (rounded rows + `STEP_ROWS`)). Sentences of like lengths (a length-sorted batch) stay one a row
  unless two fit where one did."""
  sizes = {i: n + 2 for i, n in enumerate(lengths) if n}
  if not sizes:
    return []
  order = sorted(sizes, key=lambda i: -sizes[i])
  longest, total = sizes[order[0]], sum(sizes.values())
  limit = max(max_slots, longest)
  best = None
  for target in sorted({round_rows(n) for n in range(1, len(order) + 1)}):  # each row count the batch may run as
    floor = max(longest, -(-total // target))  # the shortest rows that could hold it all in `target` rows
    if floor > limit:
      continue
    for cap in sorted({min(limit, int(floor * f)) for f in _CAPACITY_FACTORS}):
      rows, fills = _best_fit(order, sizes, cap)
      if round_rows(len(rows)) <= target or cap == limit:
        cost = max(fills) * (round_rows(len(rows)) + STEP_ROWS)
        if best is None or cost < best[0]:
          best = (cost, rows)
        break
  return best[1]


def unpack(layers: np.ndarray, packing: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[np.ndarray]:
  """`pack`'s inverse on a packed batch's layers `[rows, n_layers + 1, slots, 2P]` (`Steps.layers`): one
  `[n_layers + 1, n, 2P]` view per sentence of `lengths` tokens (a sentence whose `<S>` is at slot o has its tokens
  at o .. o + n - 1); an empty sentence, laid nowhere, an empty view."""
  cut: list[np.ndarray] = [layers[0, :, :0]] * len(lengths)
  for row, sentences in enumerate(packing):
    at = 0
    for i in sentences:
      cut[i] = layers[row, :, at:at + lengths[i]]
      at += lengths[i] + 2
  return cut


def _best_fit(order: Sequence[int], sizes: dict[int, int], cap: int) -> tuple[list[list[int]], list[int]]:
  """`order` (longest first) into rows of `cap` slots: (rows, their fills)."""
  rows: list[list[int]] = []
  fills: list[int] = []
  free: list[tuple[int, int]] = []  # (slots left, row), sorted: the fullest row with room is a bisect away
  for i in order:
    size = sizes[i]
    at = bisect.bisect_left(free, (size, -1))
    if at < len(free):
      left, row = free.pop(at)
      rows[row].append(i)
      fills[row] += size
      if left > size:
        bisect.insort(free, (left - size, row))
    else:
      rows.append([i])
      fills.append(size)
      if cap > size:
        bisect.insort(free, (cap - size, len(rows) - 1))
  return rows, fills


@dataclasses.dataclass
class Prepared:
  """One batch on the host: `n` rows that hold sentences, `positions` [rows, time] (table rows, -1: no token;
  packed: each sentence between `embed_step.BOS_ROW` and `EOS_ROW`), char-CNN input chunks."""
  n: int
  positions: np.ndarray
  chunks: list[np.ndarray]  # [devices * CNN_ROWS, width]: char ids of tokens not yet in their device's table
  dests: list[np.ndarray]  # [devices * CNN_ROWS] each: their table rows (out of range for padding: dropped)

  @property
  def mask(self) -> np.ndarray:
    """`[rows, time]` bool: the slots that hold a token."""
    return self.positions >= 0


def prepare(sentences: Sequence[Sequence[str]], rows: int, token_rows: Sequence[Any], char_ids: Any,
            time_buckets: Sequence[int], max_width: int, pad: dict[str, int],
            packing: Sequence[Sequence[int]] | None = None) -> Prepared:
  """Sentences -> a `Prepared` batch of `rows` rows (a multiple of the devices, one `token_cache.TokenRows`
  each in `token_rows`: device d's rows are block d). `char_ids`: a `chars.CharIdCache`; `max_width`, `pad`:
  as `embed_step.width_chunks`.

  `packing`: row r holds the sentences `packing[r]` (indices into `sentences`; `pack`), each between its
  boundaries, positions `[rows, bucket + 2]` (the stateless program, `embed_step.Steps.layers`); an empty
  sentence takes no slot. None: sentence r in row r, no boundaries (the stateful program)."""
  n = len(sentences) if packing is None else len(packing)
  per_device = rows // len(token_rows)
  if packing is None:
    time = bucket(max((len(s) for s in sentences), default=1) or 1, time_buckets)
  else:
    slots = max((sum(len(sentences[i]) + 2 for i in row if sentences[i]) for row in packing), default=2)
    time = bucket(max(slots - 2, 1), time_buckets) + 2
  positions = np.full((rows, time), -1, np.int32)
  chunks = []
  for d, table_rows in enumerate(token_rows):
    block = slice(d * per_device, (d + 1) * per_device)
    index: dict[str, int] = {}  # this device's distinct tokens, in order of first use
    for b in range(block.start, min(block.stop, n)):
      if packing is None:
        laid = [index.setdefault(token, len(index)) for token in sentences[b]]
      else:
        laid = []
        for i in packing[b]:
          if sentences[i]:
            laid += [embed_step.BOS_ROW, *(index.setdefault(token, len(index)) for token in sentences[i]),
                     embed_step.EOS_ROW]
      positions[b, :len(laid)] = laid
    tokens = list(index)
    row, new = table_rows.assign(tokens)
    ids = char_ids.many([tokens[u] for u in new])
    chunks.append(embed_step.width_chunks(ids, row[new], max_width, **pad))
    if len(row):
      mine = positions[block]
      positions[block] = np.where(mine >= 0, row[np.maximum(mine, 0)], mine)  # boundaries and -1 stay
  return Prepared(n, positions, *embed_step.stack_chunks(chunks))
