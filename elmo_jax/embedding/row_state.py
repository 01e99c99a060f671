"""Stateful embedding's bookkeeping: the LSTM state `(c, h)` each batch row carries into the next batch.

Host arrays, `c [n_layers, 2, rows, lstm_dim]` and `h [n_layers, 2, rows, P]` (`model.zero_state`), of as many
rows as the widest batch so far: a batch of fewer rows reads and moves on only its first rows, and of those
only the ones that held sentences; the others keep their state (bilm-tf semantics).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from elmo_jax.model import BiLMConfig, zero_state

State = tuple[np.ndarray, np.ndarray]


def restored(value: Any) -> State | None:
  """A given state (e.g. the one a resumed job saved after its last finished part) as float32 host copies."""
  return None if value is None else tuple(np.array(v, np.float32) for v in value)


def grown(state: State | None, config: BiLMConfig, rows: int) -> State:
  """`state` with at least `rows` rows; new rows (all of them before the first batch) start at zero."""
  if state is not None and state[0].shape[2] >= rows:
    return state
  out = zero_state(config, rows, xp=np)
  if state is not None:
    old = state[0].shape[2]
    out[0][:, :, :old], out[1][:, :, :old] = state
  return out


def first_rows(state: State, rows: int) -> State:
  """The state a batch of `rows` rows starts from: `[n_layers, 2, rows, dim]` views."""
  return (state[0][:, :, :rows], state[1][:, :, :rows])


def advanced(state: State, after: Any, n: int) -> State:
  """A new `state` whose first `n` rows (those that held sentences) are the batch's state `after` (device
  arrays, `[n_layers, 2, rows, dim]`); every other row keeps its state. `state` itself is left as it was
  (a batch already yielded holds it)."""
  c, h = (np.array(s) for s in state)
  c[:, :, :n], h[:, :, :n] = np.asarray(after[0])[:, :, :n], np.asarray(after[1])[:, :, :n]
  return c, h


def row(state: State, k: int) -> State:
  """Row `k`'s state: `[n_layers, 2, 1, dim]` copies."""
  return (state[0][:, :, k:k + 1].copy(), state[1][:, :, k:k + 1].copy())


def with_row(state: State, k: int, value: State) -> State:
  """A new `state` whose row `k` is `value` (`[n_layers, 2, 1, dim]`); `state` itself is left as it was."""
  c, h = (np.array(s) for s in state)
  c[:, :, k:k + 1], h[:, :, k:k + 1] = value
  return c, h
