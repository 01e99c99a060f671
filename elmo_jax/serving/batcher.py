"""Dynamic batching: requests from many clients gathered into one `Embedder` call, answered each with its own rows.

    batcher = Batcher(embedder, max_batch_tokens=4096, max_wait_ms=2, max_queue=256)
    batcher.start()
    layers = await batcher.submit([["The", "cat", "sat", "."]])   # [(n_layers + 1, 4, 2P) float32]

One thread owns the Embedder (it is not thread-safe, and one program at a time is what the devices run best): it
takes the oldest request, then every request already queued behind it until `max_batch_tokens`, and runs them as
one `embed_sentences` call: the sentences laid end to end in the rows of the warm shapes (`host_batch.pack`), so a
batch runs about the LSTM steps its tokens need whatever the mix of lengths, split over every local device.
Under load it waits up to `max_wait_ms` for as many requests as were outstanding (queued or running) while the last
batch ran: closed-loop clients whose answers went out together come back into one batch, and two groups of
clients that would take turns (each waiting for the other's batch, then its own) merge into one; a lone client
(one request outstanding) never waits. Results go back to each request's asyncio future on the event loop, in the order the requests came.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np


class QueueFull(Exception):
  """The queue holds `max_queue` requests: the caller answers 503 with Retry-After."""


class Draining(Exception):
  """The server is shutting down: accepted requests are answered, new ones refused (503)."""


@dataclasses.dataclass
class _Request:
  sentences: list[list[str]]
  tokens: int
  future: asyncio.Future
  loop: asyncio.AbstractEventLoop
  timing: dict[str, float]  # filled by the batch thread before the answer: queue_s, inference_s
  queued_at: float = dataclasses.field(default_factory=time.perf_counter)


@dataclasses.dataclass(frozen=True)
class BatchStats:
  """What one batch held and cost (the server's metrics)."""
  requests: int
  sentences: int
  tokens: int
  seconds: float
  queue_s: tuple[float, ...]  # each request's wait from submit to its batch's start
  padding: float  # the share of LSTM row-steps that ran on no token (0: none; the Embedder's `row_steps`)


class Batcher:
  """A queue of requests and the thread that runs them through `embedder` in batches.

  Args:
    embedder: a warm `Embedder` (every shape compiled at load): a call never compiles.
    max_batch_tokens: tokens (over all sentences) one batch gathers at most, however many sentences they make (the
      Embedder packs them into rows); a single request larger than this still runs, alone.
    max_wait_ms: the longest a batch waits for more requests once it has one (only while more than one request
      was outstanding during the last batch: see the module docstring).
    max_queue: requests waiting at most; one more is refused (`QueueFull`).
    on_batch: called after each batch with its `BatchStats` (the server's metrics).
  """

  def __init__(self, embedder: Any, *, max_batch_tokens: int = 4096, max_wait_ms: float = 2.0,
               max_queue: int = 256, on_batch: Callable[[BatchStats], None] | None = None):
    self.embedder = embedder
    self.max_batch_tokens, self.max_wait_s, self.max_queue = max_batch_tokens, max_wait_ms / 1000, max_queue
    self._on_batch = on_batch
    self._queue: collections.deque[_Request] = collections.deque()
    self._cond = threading.Condition()
    self._outstanding = 0  # submitted, not yet answered
    self._peak = 1  # the most outstanding at once since the running batch started: what the next batch waits for
    self._stopped = False
    self._thread = threading.Thread(target=self._run, name="elmo-batcher", daemon=True)

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    """Ends the thread once the queue is empty (what is queued is still answered)."""
    with self._cond:
      self._stopped = True
      self._cond.notify()
    self._thread.join()

  @property
  def depth(self) -> int:
    """Requests waiting (not the batch running)."""
    return len(self._queue)

  def submit(self, sentences: list[list[str]], timing: dict[str, float] | None = None) -> asyncio.Future:
    """Queues one request (its sentences answered together); returns a future of its layers, one
    `[n_layers + 1, n_tokens, 2P]` array per sentence. `timing`, if given, gets the request's `queue_s` and
    `inference_s` (its batch's time) before the future is done. Call from the event loop's thread."""
    loop = asyncio.get_running_loop()
    request = _Request(sentences, sum(map(len, sentences)), loop.create_future(), loop,
                       {} if timing is None else timing)
    with self._cond:
      if self._stopped:
        raise Draining("the server is shutting down")
      if len(self._queue) >= self.max_queue:
        self._drop_cancelled()  # a request that timed out while queued holds no place
      if len(self._queue) >= self.max_queue:
        raise QueueFull(f"{len(self._queue)} requests are queued (--max_queue={self.max_queue})")
      self._queue.append(request)
      self._outstanding += 1
      self._peak = max(self._peak, self._outstanding)
      self._cond.notify()
    return request.future

  def _drop_cancelled(self) -> None:
    """Forgets the queued requests whose callers stopped waiting (the caller holds the lock)."""
    live = collections.deque(r for r in self._queue if not r.future.cancelled())
    self._outstanding -= len(self._queue) - len(live)
    self._queue = live

  def _take(self) -> list[_Request] | None:
    """The next batch: the oldest request and those behind it within the limits (None: stopped and empty)."""
    with self._cond:
      while not self._queue:
        if self._stopped:
          return None
        self._cond.wait()
      batch = [self._queue.popleft()]
      deadline = time.perf_counter() + self.max_wait_s
      want = self._peak
      while True:
        batch += self._fill(batch)
        left = deadline - time.perf_counter()
        if len(batch) >= want or left <= 0 or self._full(batch) or self._stopped:
          break
        self._cond.wait(left)
      self._peak = self._outstanding
    return batch

  def _full(self, batch: Sequence[_Request]) -> bool:
    return sum(r.tokens for r in batch) >= self.max_batch_tokens

  def _fill(self, batch: Sequence[_Request]) -> list[_Request]:
    """Queued requests that fit beside `batch` (the caller holds the lock); skips those already cancelled."""
    tokens, added = sum(r.tokens for r in batch), []
    while self._queue:
      nxt = self._queue[0]
      if nxt.future.cancelled():  # timed out while queued: never run
        self._queue.popleft()
        self._outstanding -= 1
        continue
      if tokens + nxt.tokens > self.max_batch_tokens:
        break
      added.append(self._queue.popleft())
      tokens += nxt.tokens
    return added

  def _run(self) -> None:
    while (batch := self._take()) is not None:
      try:
        self._answer([r for r in batch if not r.future.cancelled()])
      finally:
        with self._cond:
          self._outstanding -= len(batch)

  def _answer(self, batch: list[_Request]) -> None:
    """Runs one batch and hands each request its own sentences' layers (or the error)."""
    if not batch:
      return
    sentences = [s for r in batch for s in r.sentences]
    start = time.perf_counter()
    run, needed = getattr(self.embedder, "row_steps", (0, 0))
    try:
      layers = self.embedder.embed_sentences(sentences) if sentences else []
    except Exception as e:  # pylint: disable=broad-except  (answered to each request; the server stays up)
      for r in batch:
        _hand_back(r, None, e)
      return
    seconds = time.perf_counter() - start
    at = 0
    for r in batch:
      r.timing.update(queue_s=start - r.queued_at, inference_s=seconds)
      _hand_back(r, layers[at:at + len(r.sentences)], None)
      at += len(r.sentences)
    if self._on_batch is not None:
      run_after, needed_after = getattr(self.embedder, "row_steps", (0, 0))
      ran = run_after - run
      self._on_batch(BatchStats(len(batch), len(sentences), sum(r.tokens for r in batch), seconds,
                                tuple(start - r.queued_at for r in batch),
                                1 - (needed_after - needed) / ran if ran else 0.0))


def _hand_back(request: _Request, result: list[np.ndarray] | None, error: BaseException | None) -> None:
  """From the batch thread: the answer to the request's event loop (gone at shutdown: nobody is waiting)."""
  try:
    request.loop.call_soon_threadsafe(_settle, request.future, result, error)
  except RuntimeError:  # the loop is closed
    pass


def _settle(future: asyncio.Future, result: list[np.ndarray] | None, error: BaseException | None) -> None:
  """On the event loop: a request's answer (unless it timed out and was cancelled meanwhile)."""
  if future.cancelled():
    return
  if error is not None:
    future.set_exception(error)
  else:
    future.set_result(result)
