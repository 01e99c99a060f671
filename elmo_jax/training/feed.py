"""All host -> device work of the trainer, for train and eval batches: one way onto the devices.

    data iterator (host numpy, this process's rows; with dedupe, per-device token tables already)
      -> [several processes: pad every process's tables to one agreed size: a collective]
      -> `jax.make_array_from_process_local_data` (global arrays split over the mesh's data axis)

Training batches go through `make_feed`: a background thread (`Prefetcher`) builds them `depth` steps
ahead (and, with one process, puts them on the devices too, so the copy overlaps the running step); with
several processes `AgreedFeed` agrees the table sizes once per block of steps on the main thread, where
every process runs the collective at the same point. Eval batches are put one at a time (`device_batch`).
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from elmo_jax.training.step import batch_sharding


def _pad_table(local_batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
  """`token_chars` [shards, U, C] padded with empty rows to U = `size` (the size all processes agreed)."""
  table = local_batch["token_chars"]
  return {**local_batch, "token_chars": np.pad(table, ((0, 0), (0, size - table.shape[1]), (0, 0)))}


def _table_size(local_batch: dict[str, np.ndarray]) -> int:
  return local_batch["token_chars"].shape[1] if "token_chars" in local_batch else 0


def to_devices(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Host rows (deduped, tables agreed) -> global arrays split over the mesh. No collective."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def device_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """One batch of this process's rows -> global arrays (one or many processes; with several, a collective
  agrees the table size, so every process calls this at the same point). A pure function of the batch;
  the step jits one variant per table size."""
  if "token_chars" in local_batch and jax.process_count() > 1:
    size = int(np.max(multihost_utils.process_allgather(np.array(_table_size(local_batch)))))
    local_batch = _pad_table(local_batch, size)
  return to_devices(local_batch, mesh)


def make_feed(train_iter, mesh: Mesh, depth: int, block: int):
  """Training batches built (and, with one process, put on the devices) on a background thread, `depth`
  ahead. Several processes: the thread builds the host batches; `AgreedFeed` agrees on the table sizes once
  per `block` steps (a collective, so on the main thread) and puts the batches on the devices."""
  if jax.process_count() == 1:
    return Prefetcher(train_iter, lambda b: to_devices(b, mesh), depth)
  return AgreedFeed(Prefetcher(train_iter, lambda b: b, max(depth, block)), mesh, block)


_END = object()


class Prefetcher:
  """Builds batches on a background thread, `depth` ahead of the step that uses them.

  `next()` returns `(batch, data_state)`: `transform(next(iterator))` and the iterator's `get_state()` right
  after that batch, so a checkpoint records the position of the batches the steps consumed, never of the
  ones still queued (a resumed run rebuilds those). `transform` may `jax.device_put` the batch, so the
  copy to the devices overlaps the running step too. Errors of the iterator surface at `next()`.
  """

  def __init__(self, iterator, transform: Callable[[Any], Any], depth: int = 2):
    self._iterator, self._transform = iterator, transform
    self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
    self._stop = threading.Event()
    self.wait_sec = 0.0  # time `next()` spent waiting for the producer (the step's data wait)
    self._thread = threading.Thread(target=self._produce, name="batch-prefetch", daemon=True)
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _produce(self) -> None:
    try:
      for batch in self._iterator:
        item = (self._transform(batch), self._iterator.get_state())
        if not self._put(item):
          return
      self._put(_END)
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the consumer)
      self._put(e)

  def ready(self) -> bool:
    """True if `next()` will not block."""
    return not self._queue.empty()

  def next(self):
    started = time.perf_counter()
    item = self._queue.get()
    self.wait_sec += time.perf_counter() - started
    if item is _END:
      self._queue.put(_END)
      raise StopIteration
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self) -> None:
    self._stop.set()
    while self._thread.is_alive():
      try:
        self._queue.get(timeout=0.1)
      except queue.Empty:
        pass
    self._thread.join()


class AgreedFeed:
  """Several processes: pads every process's deduped tables to one size and puts the batches on the devices.

  The sizes are agreed for `block` batches at once (one small all-gather per block instead of one per step),
  on the main thread, so every process runs the collective at the same point of the step sequence.
  """

  def __init__(self, feed: Prefetcher, mesh: Mesh, block: int = 10):
    self._feed, self._mesh, self._block = feed, mesh, max(block, 1)
    self._ready: collections.deque = collections.deque()

  @property
  def wait_sec(self) -> float:
    return self._feed.wait_sec

  def ready(self) -> bool:
    return bool(self._ready) or self._feed.ready()

  def next(self):
    if not self._ready:
      self._agree_block()
    if not self._ready:
      raise StopIteration
    return self._ready.popleft()

  def _agree_block(self) -> None:
    items = []
    for _ in range(self._block):  # the training stream repeats forever: every process gets `block` batches
      try:
        items.append(self._feed.next())
      except StopIteration:
        break
    sizes = np.array([_table_size(b) for b, _ in items], np.int64)
    agreed = np.max(multihost_utils.process_allgather(sizes), axis=0) if len(sizes) else sizes
    for (batch, data_state), size in zip(items, agreed.tolist()):
      if "token_chars" in batch:
        batch = _pad_table(batch, size)
      self._ready.append((to_devices(batch, self._mesh), data_state))

  def close(self) -> None:
    self._feed.close()
