"""A sentence longer than a warm Embedder's longest time bucket: both LSTM stacks run over fixed stretches of it,
so any length runs without a compile, in memory linear in its length.

Stateless ELMo is bidirectional: the backward stack must read the whole sentence, so cutting the sentence into
pieces (with or without overlap) is not ELMo. Here nothing is cut. Each direction's reading of the sentence
(`<S>`, the tokens, `</S>`; the backward one reversed) is fed to `Steps.stretch` `STRETCH` steps at a time, the
LSTM state of both stacks carried from stretch to stretch on the device, as one run over the whole reading
carries it from step to step. A step is the same step (`model.lstm.lstm_steps`; the input half computed for the
same 32-step chunks, which a stretch holds whole) in both, so the layers have the bits of the compile-as-you-go
path (an Embedder with `warm=False`, which compiles a time bucket of the sentence's length). The char CNN fills the token table as for any batch of that one sentence.

Device memory is that of one stretch; the host holds the sentence's positions and its layers
`[n_layers + 1, n_tokens, 2P]`; stretch k + 1 is dispatched before stretch k is copied back.
"""
from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np

from elmo_jax.embedding import row_state
from elmo_jax.embedding import step as embed_step
from elmo_jax.model import BiLMConfig

STRETCH = 512  # steps per stretch: the largest warm time bucket, so one dispatch carries as much work as a batch


def readings(positions: np.ndarray, rows: int, stretch: int = STRETCH):
  """A sentence's table rows `[n]` -> (forward, backward) positions `[rows, stretch]` per stretch, each direction
  in its reading order with `BOS_ROW` / `EOS_ROW` in place; row 0 holds the sentence, the others nothing."""
  forward = np.concatenate([[embed_step.BOS_ROW], positions, [embed_step.EOS_ROW]]).astype(np.int32)
  backward = forward[::-1]
  for start in range(0, len(forward), stretch):
    out = []
    for reading in (forward, backward):
      part = np.full((rows, stretch), -1, np.int32)
      piece = reading[start:start + stretch]
      part[0, :len(piece)] = piece
      out.append(part)
    yield start, out[0], out[1]


def _place(layers: np.ndarray, start: int, tokens: Any, outputs: Any) -> None:
  """Writes one stretch's row 0 into `layers [n_layers + 1, n, 2P]`: reading step j (0 = `<S>`) is token j - 1
  of the forward reading and token n - j of the backward one."""
  n, dim = layers.shape[1], layers.shape[2] // 2
  tokens = np.asarray(tokens.addressable_shards[0].data)[0]  # device 0 holds row 0: [stretch, P]
  outputs = np.asarray(outputs.addressable_shards[0].data)[:, :, 0]  # [n_layers, 2, stretch, P]
  j = start + np.arange(tokens.shape[0])
  real = (j >= 1) & (j <= n)
  fwd, bwd = j[real] - 1, n - j[real]
  layers[0, fwd, :dim] = layers[0, fwd, dim:] = tokens[real]
  layers[1:, fwd, :dim] = outputs[:, 0, real]
  layers[1:, bwd, dim:] = outputs[:, 1, real]


def embed(steps: embed_step.Steps, params: Any, constants: Any, table: jax.Array, positions: np.ndarray,
          config: BiLMConfig, state: row_state.State | None = None, row: int = 0
          ) -> tuple[np.ndarray, row_state.State | None]:
  """One sentence whose tokens sit at table rows `positions [n]` of device 0's table -> its layers
  `[n_layers + 1, n, 2P]` float32, and the rows' state with row `row` moved on past it (None stays None:
  stateless, the sentence starts from zeros)."""
  rows = steps.mesh.size
  start_state = row_state.grown(None, config, rows)
  if state is not None:
    state = row_state.grown(state, config, row + 1)
    start_state[0][:, :, :1], start_state[1][:, :, :1] = row_state.row(state, row)
  carried = jax.device_put(start_state, steps.state_sharding)
  layers = np.zeros((config.n_layers + 1, len(positions), 2 * config.projection_dim), np.float32)
  pending: collections.deque = collections.deque()
  for start, fwd, bwd in readings(positions, rows):
    tokens, outputs, carried = steps.stretch(params, constants, table, steps.put_rows(fwd), steps.put_rows(bwd),
                                             carried)
    pending.append((start, tokens, outputs))
    if len(pending) > 1:
      _place(layers, *pending.popleft())
  while pending:
    _place(layers, *pending.popleft())
  if state is not None:
    state = row_state.with_row(state, row, tuple(np.asarray(s)[:, :, :1] for s in carried))
  return layers, state
