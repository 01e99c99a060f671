"""The `Embedder`'s compiled functions, over a 1-D mesh of this process's devices.

Sentences are split over the devices by batch row, and every function is a `shard_map` in which a device
sees only its own rows, with the params replicated: the char CNN, the token table and the biLM of one
device are those of a single-device `Embedder` (with the same rows and time bucket, the same shapes and
so the same numbers; otherwise equal to float rounding), and nothing passes between devices -- no
collective at all. Each device keeps its own table of char-CNN outputs
([devices, capacity, P], one block per device) with its own row assignment on the host
(`token_cache.TokenRows`): a token runs through the CNN once per device that meets it, not once per batch.
One replicated table would save those repeats (a few per word, early in a file) but needs an all-gather
per chunk of new tokens, which orders every device behind the slowest; and on CPU devices that share a
thread pool, collectives inside asynchronously dispatched programs can wait on each other for good.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elmo_jax.data import chars
from elmo_jax.model import BiLM
from elmo_jax.model.bilm import inference_constants
from elmo_jax.model.char_cnn import widths

AXIS = "rows"
_STATE = P(None, None, AXIS)  # LSTMState arrays are [layers, 2, rows, dim]
CNN_ROWS = 64  # distinct tokens per char-CNN call: a fixed shape (per width), little padding per batch
# A call that brings at most CNN_ROWS new tokens (a sentence or a few) runs them in one chunk of the first of these
# sizes that holds them, at the widest width they need: on 2 CPU cores a char-CNN call costs ~2.5 ms however few
# its rows (the highway layer's weights are read once a call) plus ~0.1 ms a row, so one small call beats one
# 64-row call per width several times over.
CNN_CHUNK_ROWS = (8, 16, 32, CNN_ROWS)
PAD_ID = chars.PAD_CHAR + 1  # token_to_ids shifts ids by one
# Packed rows' and a long sentence's positions (`layers`, `stretch`): table rows, or these for a sentence's boundary
# tokens; -1: no token
BOS_ROW, EOS_ROW = -2, -3


class DeviceError(ValueError):
  """A `devices=` choice this process cannot make; the message says what it has."""


def local_mesh(devices: int | Sequence[Any] | None = None) -> Mesh:
  """A 1-D mesh over `devices`: None = all of this process's devices, an int k = the first k, or a list.

  Only local devices: an embedding process never waits on another (many processes each embed their own
  share of the input, see `elmo_jax.embed`).
  """
  local = jax.local_devices()
  if devices is None:
    chosen = list(local)
  elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
    if not 1 <= devices <= len(local):
      raise DeviceError(f"devices={devices}: this process has {len(local)} local device"
                       f"{'s' if len(local) > 1 else ''} ({local[0].platform})")
    chosen = list(local[:int(devices)])
  else:
    try:
      chosen = list(devices)
    except TypeError:
      raise TypeError(f"devices must be None, an int or a list of devices, got {devices!r}") from None
    ids = [getattr(d, "id", None) for d in chosen]
    if not chosen or len(set(ids)) != len(ids) or any(d not in local for d in chosen):
      raise DeviceError(f"devices must be distinct local devices of this process ({local}), got {chosen}")
  return Mesh(np.array(chosen), (AXIS,))


def char_widths(ids: np.ndarray, max_width: int, pad_id: int = PAD_ID, lead: int = 0) -> np.ndarray:
  """Char positions each token `ids [U, max_chars]` needs for an exact char CNN: `[U]` (ids kept, `lead`
  word ids before the chars included; `pad_id`: the padding char's id, bilm-tf's or a char vocabulary's).

  A token of n positions (BOW, bytes, EOW) padded with PAD ids: every conv window of width w that starts at
  or after n sees only PAD, so all of them give the same value. Cut to k >= n + max_width positions, the
  windows that touch the token are all still there and so is at least one all-PAD window (also present
  over all max_chars positions), hence the max over positions -- the CNN's output -- is unchanged.
  """
  max_chars = ids.shape[1]
  cuts = np.array(widths(max_chars))
  need = lead + np.count_nonzero(ids[:, lead:] != pad_id, axis=1) + max_width
  return cuts[np.minimum(np.searchsorted(cuts, need), len(cuts) - 1)]


def width_chunks(ids: np.ndarray, rows: np.ndarray, max_width: int, pad_id: int = PAD_ID,
                 lead: int = 0) -> list[tuple[int, np.ndarray, np.ndarray]]:
  """Char ids `[U, max_chars]` of tokens bound for table rows `rows [U]` -> (width, chunk `[R, width]`, their
  rows `[R]`) per chunk (the CNN's fixed shapes; padding rows: an out-of-range row). The tokens in order of the
  char width they need, cut into chunks of CNN_ROWS, each at the widest width in it; the last (or only) chunk of
  the smallest `CNN_CHUNK_ROWS` size R that holds it. A chunk costs its weights' read and pack (~2.5 ms on 2 CPU
  cores for `small`) plus ~0.1 ms a row, so few full chunks beat one per width: a batch's ~200 new tokens of 7
  widths run as 4 chunks, not 7. `pad_id`, `lead`: as `char_widths`."""
  widths = char_widths(ids, max_width, pad_id, lead)
  order = np.argsort(widths, kind="stable")
  out = []
  for start in range(0, len(order), CNN_ROWS):
    part = order[start:start + CNN_ROWS]
    width = int(widths[part].max())
    size = next(r for r in CNN_CHUNK_ROWS if r >= len(part))
    chunk = np.zeros((size, width), np.int32)
    dest = np.full(size, np.iinfo(np.int32).max, np.int32)
    chunk[:len(part)], dest[:len(part)] = ids[part, :width], rows[part]
    out.append((width, chunk, dest))
  return out


def stack_chunks(per_device: Sequence[list[tuple[int, np.ndarray, np.ndarray]]]
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Each device's `width_chunks` -> one call's input per chunk: ids `[devices * R, width]` and rows
  `[devices * R]` (device d's block d, each padded to the largest R among the devices' j-th chunks of that width;
  a device with fewer chunks of a width gets padding)."""
  widths = sorted({w for chunks in per_device for w, _, _ in chunks})
  ids, dests = [], []
  for width in widths:
    mine = [[(c, d) for w, c, d in chunks if w == width] for chunks in per_device]
    for j in range(max(len(m) for m in mine)):
      size = max(m[j][0].shape[0] for m in mine if j < len(m))
      blocks = [_padded(*(m[j] if j < len(m) else (np.zeros((0, width), np.int32), np.zeros(0, np.int32))), size)
                for m in mine]
      ids.append(np.concatenate([c for c, _ in blocks]))
      dests.append(np.concatenate([d for _, d in blocks]))
  return ids, dests


def _padded(chunk: np.ndarray, dest: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
  """A chunk `[r, width]` and its rows `[r]` padded to `size` rows (padding: no chars, an out-of-range row)."""
  pad = size - chunk.shape[0]
  return (np.pad(chunk, ((0, pad), (0, 0))),
          np.pad(dest, (0, pad), constant_values=np.iinfo(np.int32).max))


def round_rows(rows: int, mesh: Mesh) -> int:
  """`rows` rounded up to a multiple of the device count (every device gets the same number)."""
  n = mesh.size
  return -(-max(rows, 1) // n) * n


@dataclasses.dataclass(frozen=True)
class Steps:
  """What an `Embedder` dispatches; see `steps`. Shapes are global: device d holds block d of each."""
  mesh: Mesh
  cnn_into: Callable[..., jax.Array]  # (params, tables [devices, capacity, P], ids [d*R, width], dest [d*R])
  gather: Callable[..., jax.Array]  # (tables, positions [rows, time]) -> [rows, time, P]
  # `constants`: the `bilm.inference_constants` of `params`, made once by the Embedder
  bilm: Callable[..., Any]  # (params, constants, emb, mask [rows, time]) -> layers [rows, n_layers + 1, time, 2P]
  bilm_stateful: Callable[..., Any]  # (params, constants, emb, mask, state) -> (layers, state)
  # gather + biLM in one program (one dispatch): (params, constants, tables, positions [rows, time + 2]: packed
  # rows, table rows between BOS_ROW and EOS_ROW, -1 = no token) -> layers [rows, n_layers + 1, time, 2P] (`pack`)
  layers: Callable[..., Any]
  # stateful, one sentence a row: (params, constants, tables, positions [rows, time], -1 = no token, state)
  layers_stateful: Callable[..., Any]  # -> (layers [rows, n_layers + 1, time, 2P], state)
  # one stretch of a long sentence (`long_sentence`): (params, constants, tables, fwd, bwd positions [rows, STRETCH]
  # in each direction's reading order, BOS_ROW / EOS_ROW included, state) -> (tokens [rows, STRETCH, P],
  # outputs [n_layers, 2, rows, STRETCH, P], state)
  stretch: Callable[..., Any]
  constants: Callable[..., Any]  # params -> their `bilm.inference_constants` (each call's `constants`)

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  @property
  def by_rows(self) -> NamedSharding:
    return NamedSharding(self.mesh, P(AXIS))

  @property
  def state_sharding(self) -> NamedSharding:
    return NamedSharding(self.mesh, _STATE)

  def put_rows(self, x: np.ndarray) -> jax.Array:
    """A host array `[rows, ...]` onto the devices, each its own block (one copy per device, no broadcast)."""
    return jax.device_put(x, self.by_rows)

  def warm(self, params, constants, table: jax.Array, rows: Sequence[int], times: Sequence[int], widths: Sequence[int],
           state: Callable[[int], Any] | None = None, stretch: int = 0,
           state_zeros: Callable[[int], Any] | None = None) -> jax.Array:
    """Compiles (or loads from the persistent compilation cache) every program a call of `rows` x `times`
    runs, by running each once on empty inputs: no token, so the LSTMs run zero steps and the char CNN's rows
    are all dropped. `state`: n -> zeros of n stateful rows (then `layers_stateful`); `stretch`: the long
    sentences' program for stretches of that many steps (`state_zeros` as `state`). Returns the table
    (`cnn_into` donates it)."""
    put = self.put_rows
    for width, size in ((w, r) for w in widths for r in CNN_CHUNK_ROWS):
      ids = np.zeros((self.mesh.size * size, width), np.int32)
      table = self.cnn_into(params, table, put(ids), put(np.full(len(ids), np.iinfo(np.int32).max, np.int32)))
    last = None  # one output held at a time: all of them at once would hold ~260 MB (small preset, 64 rows)
    for n, time in ((n, t) for n in rows for t in times):
      if state is None:  # packed rows: two slots more for the first sentence's boundaries
        out = self.layers(params, constants, table, put(np.full((n, time + 2), -1, np.int32)))
      else:
        out = self.layers_stateful(params, constants, table, put(np.full((n, time), -1, np.int32)),
                                   jax.device_put(state(n), self.state_sharding))
      jax.block_until_ready(last)  # the one before has run while this one compiled
      last = out
    if stretch:
      none = put(np.full((self.mesh.size, stretch), -1, np.int32))
      out = self.stretch(params, constants, table, none, none,
                         jax.device_put(state_zeros(self.mesh.size), self.state_sharding))
      jax.block_until_ready(last)
      last = out
    jax.block_until_ready((table, last))
    return table


# One set per (model, mesh): `BiLM` is hashable (its config and dtype), so every Embedder of the same model
# on the same devices (an untrained twin, a second copy) shares the executables.
@functools.lru_cache(maxsize=None)
def steps(model: BiLM, mesh: Mesh) -> Steps:
  """The jitted char CNN, table gather and biLM of `model` over `mesh`, each a `shard_map` by rows."""

  def cnn_into(params, tables, ids, dest):
    # Writes the char-CNN outputs of this device's chunk into rows `dest` of its table, in place (donated);
    # a padding row's out-of-range `dest` drops it.
    values = model.apply({"params": params}, ids, method=BiLM.embed_tokens)
    return tables.at[0, dest].set(values.astype(tables.dtype), mode="drop")

  def gather(tables, positions):
    return jnp.take(tables[0], positions, axis=0)

  def bilm(params, constants, emb, mask, state=None):
    out = model.apply({"params": params}, token_embeddings=emb, mask=mask, state=state, skip_padding=True,
                      constants=constants)
    return out["layers"] if state is None else (out["layers"], out["state"])

  def embeddings(tables, positions, boundary):  # as `BiLM.__call__` places tokens and boundaries: the same values
    tokens = jnp.take(tables[0], jnp.maximum(positions, 0), axis=0)
    at = positions[..., None]
    return jnp.where(at == BOS_ROW, boundary[0], jnp.where(at == EOS_ROW, boundary[1],
                                                           jnp.where(at >= 0, tokens, 0.0)))

  def layers(params, constants, tables, positions):
    # Packed rows (`pack`): each sentence between its own BOS_ROW and EOS_ROW, several to a row, the LSTMs'
    # state reset at each (`BiLM.packed`); one sentence a row is the same program. Slot 0 is always a row's
    # first `<S>`, so the layers are returned from slot 1 on: a sentence whose `<S>` is at slot o has its tokens
    # at o .. o + n - 1 of the output (one a row: 0 .. n - 1, as `BiLM.__call__` gives them); zeros elsewhere.
    out = model.apply({"params": params}, embeddings(tables, positions, constants.boundary), positions != -1,
                      positions == BOS_ROW, positions == EOS_ROW, constants.lstm, method=BiLM.packed)
    token = positions[:, 1:-1] >= 0
    return jnp.where(token[:, None, :, None], out[:, :, 1:-1], 0.0)

  def layers_stateful(params, constants, tables, positions, state):
    # the gather's value at a padded slot is never read (the biLM zeroes the slots its mask leaves out)
    return bilm(params, constants, gather(tables, jnp.maximum(positions, 0)), positions >= 0, state)

  def stretch(params, constants, tables, fwd, bwd, state):
    fwd_x = embeddings(tables, fwd, constants.boundary)
    outputs, state = model.apply({"params": params}, fwd_x, embeddings(tables, bwd, constants.boundary), fwd != -1,
                                 bwd != -1, state, constants.lstm, method=BiLM.lstm_stretch)
    return fwd_x, outputs, state

  # check_vma=False: inference only (no transpose to type), and the LSTM scan's zero initial carry is
  # device-invariant while its body's is per-device.
  by_rows = functools.partial(jax.shard_map, mesh=mesh, check_vma=False)
  return Steps(
      mesh=mesh,
      cnn_into=jax.jit(by_rows(cnn_into, in_specs=(P(), P(AXIS), P(AXIS), P(AXIS)), out_specs=P(AXIS)),
                       donate_argnums=1),
      gather=jax.jit(by_rows(gather, in_specs=(P(AXIS), P(AXIS)), out_specs=P(AXIS))),
      bilm=jax.jit(by_rows(bilm, in_specs=(P(), P(), P(AXIS), P(AXIS)), out_specs=P(AXIS))),
      bilm_stateful=jax.jit(by_rows(bilm, in_specs=(P(), P(), P(AXIS), P(AXIS), _STATE),
                                    out_specs=(P(AXIS), _STATE))),
      layers=jax.jit(by_rows(layers, in_specs=(P(), P(), P(AXIS), P(AXIS)), out_specs=P(AXIS))),
      layers_stateful=jax.jit(by_rows(layers_stateful, in_specs=(P(), P(), P(AXIS), P(AXIS), _STATE),
                                      out_specs=(P(AXIS), _STATE))),
      stretch=jax.jit(by_rows(stretch, in_specs=(P(), P(), P(AXIS), P(AXIS), P(AXIS), _STATE),
                              out_specs=(P(AXIS), P(None, None, AXIS), _STATE))),
      constants=jax.jit(functools.partial(inference_constants, model)))
