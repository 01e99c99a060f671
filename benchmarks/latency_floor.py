"""The floor of one embedding call on this machine, and where a typical call's time goes (embed_latency.py).

A call of a sentence of n tokens runs two kinds of programs (embedding/step.py):
  * the char CNN over the tokens the table does not hold yet (one call of a few rows at their widest width:
    `width_chunks`): FLOPs of the convolutions over each token's char positions, the highway layers and the
    projection; bytes: its weights, read once per call;
  * the biLSTM over n + 2 steps (`<S>`, `</S>`), each step a matrix-vector product per cell (2 directions x
    n_layers cells, batch 1): FLOPs 2 (I + P) 4H + 2 H P per cell; bytes: the recurrent weights (W_h [P, 4H] and
    W_P [H, P]) every step, the input weights (W_x [I, 4H]) once a call: x @ W_x of every step is one matmul
    (`model/lstm.lstm_steps` reads them once per 32 steps).
A program's floor is max(FLOPs / the measured matmul peak, bytes / the measured read bandwidth of a working set of
that many bytes: the bandwidth a cache-resident LSTM gets if its weights fit, DRAM's if not); a call's floor is the
sum. Host work, dispatch and copies have no floor here: they are what the split shows.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_F32 = 4
_NO_ROW = np.iinfo(np.int32).max  # a chunk's padding rows


def read_bandwidth(nbytes: int, reps: int = 20) -> float:
  """Best bytes/s of a jitted sum over a float32 array of `nbytes` (read again and again: cache-resident when it
  fits)."""
  x = jnp.ones((max(1, nbytes // _F32),), jnp.float32)
  f = jax.jit(jnp.sum)
  f(x).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(x).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return x.size * _F32 / best


def _cnn_dims(options: dict[str, Any]) -> tuple[list[tuple[int, int]], int, int, int, int]:
  cnn = options["char_cnn"]
  filters = [(int(w), int(n)) for w, n in cnn["filters"]]
  return filters, int(cnn["embedding"]["dim"]), sum(n for _, n in filters), int(cnn["n_highway"]), \
      int(options["lstm"]["projection_dim"])


def cnn_cost(options: dict[str, Any], widths: list[int]) -> tuple[float, float]:
  """(FLOPs, weight bytes) of the char CNN over tokens cut at char `widths` (one per token) in one call."""
  filters, char_dim, d, n_highway, proj = _cnn_dims(options)
  per_token = lambda w: sum(2 * max(0, w - fw + 1) * fw * char_dim * nf for fw, nf in filters)
  dense = n_highway * 2 * d * 2 * d + 2 * d * proj
  flops = sum(per_token(w) + dense for w in widths)
  weights = sum(fw * char_dim * nf for fw, nf in filters) + n_highway * d * 2 * d + d * proj
  return float(flops), float(weights * _F32 if widths else 0)


def lstm_cost(options: dict[str, Any]) -> tuple[float, float, float]:
  """(FLOPs, recurrent weight bytes) of one biLSTM step at batch 1, both directions, every layer; and the input
  weight bytes (W_x and the biases) a call reads once."""
  lstm = options["lstm"]
  h, p, layers = int(lstm["dim"]), int(lstm["projection_dim"]), int(lstm["n_layers"])
  cells = 2 * layers
  flops = cells * (2 * (p + p) * 4 * h + 2 * h * p)
  return float(flops), float(cells * (p * 4 * h + h * p) * _F32), float(cells * (p * 4 * h + 4 * h) * _F32)


class Floor:
  """A call's floor on this machine (`peak` FLOP/s; bandwidths measured once per working-set size)."""

  def __init__(self, options: dict[str, Any], peak: float):
    self.options, self.peak = options, peak
    self._step_flops, self._step_bytes, self._input_bytes = lstm_cost(options)
    self._cnn_bytes = cnn_cost(options, [16])[1]
    self.bandwidth = {"lstm_weights": read_bandwidth(int(self._step_bytes)),
                      "cnn_weights": read_bandwidth(int(self._cnn_bytes)),
                      "dram_256mb": read_bandwidth(256 << 20)}

  def ms(self, n_tokens: int, new_token_widths: list[int]) -> dict[str, float]:
    """Floor of a call of one sentence of `n_tokens`, `new_token_widths` the char widths of its new tokens."""
    flops, nbytes = cnn_cost(self.options, new_token_widths)
    cnn = max(flops / self.peak, nbytes / self.bandwidth["cnn_weights"]) if new_token_widths else 0.0
    step = max(self._step_flops / self.peak, self._step_bytes / self.bandwidth["lstm_weights"])
    lstm = (n_tokens + 2) * step + self._input_bytes / self.bandwidth["lstm_weights"]
    return {"cnn": cnn * 1e3, "lstm": lstm * 1e3, "total": (cnn + lstm) * 1e3}

  def describe(self) -> dict[str, Any]:
    """The numbers the floor is made of (bytes, FLOPs, bandwidths), for the docs' arithmetic."""
    return {"matmul_peak_gflops": round(self.peak / 1e9, 1),
            "read_gbytes_per_s": {k: round(v / 1e9, 1) for k, v in self.bandwidth.items()},
            "lstm_step": {"mflops": round(self._step_flops / 1e6, 2), "weight_mb": round(self._step_bytes / 2**20, 2)},
            "lstm_call_input_weight_mb": round(self._input_bytes / 2**20, 2),
            "cnn_call_weight_mb": round(self._cnn_bytes / 2**20, 2)}


def typical_split(emb: Any, sentences: list[list[str]], floor: Floor) -> dict[str, Any]:
  """Single-sentence calls over `sentences` (the benchmark's mix, not seen before), each phase synchronous:
  `ids` (host: token rows, char ids, chunks), `cnn` (new tokens into the table), `bilm` (gather + biLSTM),
  `copy`; medians in ms, what the calls did (new tokens, CNN rows and calls, LSTM steps, time bucket and the
  share of it that is padding), and ours / the floor per call."""
  from elmo_jax.embedding import step as embed_step  # pylint: disable=g-import-not-at-top
  phases: dict[str, list[float]] = {"ids": [], "cnn": [], "bilm": [], "copy": []}
  did: dict[str, list[float]] = {"tokens": [], "new_tokens": [], "cnn_rows": [], "cnn_calls": [], "time_bucket": [],
                                 "padding_share": []}
  ratios, floors, all_widths = [], [], []
  steps = emb._steps  # pylint: disable=protected-access
  for s in sentences:
    t0 = time.perf_counter()
    prepared = emb._prepare([s], 1)  # pylint: disable=protected-access
    t1 = time.perf_counter()
    emb._write_new_tokens(prepared)  # pylint: disable=protected-access
    jax.block_until_ready(emb._table)  # pylint: disable=protected-access
    t2 = time.perf_counter()
    table = emb._table  # pylint: disable=protected-access
    layers = steps.layers(emb.params, emb.constants, table, steps.put_rows(prepared.positions))
    jax.block_until_ready(layers)
    t3 = time.perf_counter()
    _ = np.array(np.asarray(layers)[0, :, :len(s)])
    t4 = time.perf_counter()
    for name, a, b in (("ids", t0, t1), ("cnn", t1, t2), ("bilm", t2, t3), ("copy", t3, t4)):
      phases[name].append((b - a) * 1e3)
    widths = []  # the char width each new token needs (device 0's rows of each chunk)
    for chunk, dest in zip(prepared.chunks, prepared.dests):
      rows = chunk[:chunk.shape[0] // steps.mesh.size][dest[:dest.shape[0] // steps.mesh.size] != _NO_ROW]
      cut = embed_step.char_widths(rows, emb._max_width, **emb._pad)  # pylint: disable=protected-access
      widths += [int(w) for w in cut]
    bucket = prepared.positions.shape[1] - 2  # a stateless row holds the sentence's <S> and </S> too
    for key, value in (("tokens", len(s)), ("new_tokens", len(widths)), ("cnn_calls", len(prepared.chunks)),
                       ("cnn_rows", sum(c.shape[0] for c in prepared.chunks) // steps.mesh.size),
                       ("time_bucket", bucket), ("padding_share", 1 - len(s) / bucket)):
      did[key].append(value)
    all_widths += widths
    floor_ms = floor.ms(len(s), widths)["total"]
    floors.append(floor_ms)
    ratios.append((t4 - t0) * 1e3 / floor_ms)
  return {"ms": {k: round(statistics.median(v), 3) for k, v in phases.items()},
          "calls": {k: round(statistics.mean(v), 2) for k, v in did.items()},
          "new_token_width_mean": round(statistics.mean(all_widths), 1) if all_widths else 0.0,
          "floor_ms_p50": round(statistics.median(floors), 3),
          "ours_over_floor_p50": round(statistics.median(ratios), 2)}


def by_length(floor: Floor, new_share: float, mean_width: float, lengths=(8, 16, 23, 32, 64, 128)) -> dict[str, Any]:
  """The floor per sentence length (ms), with the mix's share of new tokens at their mean char width."""
  out = {}
  for n in lengths:
    new = int(round(new_share * n))
    out[str(n)] = {k: round(v, 3) for k, v in floor.ms(n, [int(round(mean_width))] * new).items()}
  return out
