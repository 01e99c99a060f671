"""The host side of an `Embedder` batch: time buckets, token positions against each device's token table,
and the char ids of the tokens the table does not hold yet, cut into the char CNN's fixed chunks."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

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


@dataclasses.dataclass
class Prepared:
  """One batch on the host: sentences [n], `positions` [rows, time] (table rows; -1: no token), char-CNN
  input chunks."""
  n: int
  positions: np.ndarray
  chunks: list[np.ndarray]  # [devices * CNN_ROWS, width]: char ids of tokens not yet in their device's table
  dests: list[np.ndarray]  # [devices * CNN_ROWS] each: their table rows (out of range for padding: dropped)

  @property
  def mask(self) -> np.ndarray:
    """`[rows, time]` bool: the slots that hold a token."""
    return self.positions >= 0


def prepare(sentences: Sequence[Sequence[str]], rows: int, token_rows: Sequence[Any], char_ids: Any,
            time_buckets: Sequence[int], max_width: int, pad: dict[str, int]) -> Prepared:
  """Sentences -> a `Prepared` batch of `rows` rows (a multiple of the devices, one `token_cache.TokenRows`
  each in `token_rows`: device d's rows are block d). `char_ids`: a `chars.CharIdCache`; `max_width`, `pad`:
  as `embed_step.width_chunks`."""
  n = len(sentences)
  per_device = rows // len(token_rows)
  time = bucket(max((len(s) for s in sentences), default=1) or 1, time_buckets)
  positions = np.full((rows, time), -1, np.int32)
  chunks = []
  for d, table_rows in enumerate(token_rows):
    block = slice(d * per_device, (d + 1) * per_device)
    index: dict[str, int] = {}  # this device's distinct tokens, in order of first use
    for b in range(block.start, min(block.stop, n)):
      positions[b, :len(sentences[b])] = [index.setdefault(token, len(index)) for token in sentences[b]]
    tokens = list(index)
    row, new = table_rows.assign(tokens)
    ids = char_ids.many([tokens[u] for u in new])
    chunks.append(embed_step.width_chunks(ids, row[new], max_width, **pad))
    if len(row):
      mine = positions[block]
      positions[block] = np.where(mine >= 0, row[np.maximum(mine, 0)], -1)
  return Prepared(n, positions, *embed_step.stack_chunks(chunks))
