"""The server's Prometheus metrics (`GET /metrics`, the text exposition format), in a registry of its own.

    elmo_requests_total{endpoint, status}        requests answered, by route and HTTP status
    elmo_request_seconds{endpoint}               latency from the request's arrival to its answer (histogram)
    elmo_batch_requests, elmo_batch_sentences,   what each device batch held (histograms)
    elmo_batch_tokens
    elmo_batch_seconds                           the Embedder's time per batch (histogram)
    elmo_batch_padding_ratio                     the share of a batch's LSTM row-steps that ran on no token
                                                 (histogram; sentences are packed into rows: near 0)
    elmo_queue_seconds, elmo_inference_seconds   each request's wait for its batch, and its batch's time
                                                 (histograms; also its response's x-queue-time and
                                                 x-inference-time headers)
    elmo_queue_depth                             requests waiting for a batch
    elmo_in_flight                               requests accepted and not yet answered
    elmo_compiles_since_ready                    JAX traces + compiles since the server said ready: always 0
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from elmo_jax.runtime.compile_count import CompileCounter
from elmo_jax.serving.batcher import BatchStats

_LATENCY = (.001, .0025, .005, .0075, .01, .015, .02, .03, .05, .075, .1, .15, .25, .5, 1, 2.5, 5, 10, 30)
_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_SHARES = (.02, .05, .1, .15, .2, .3, .4, .5, .6, .8, 1)


class Metrics:
  """One server's metrics; `observe_batch` is the `Batcher`'s `on_batch`."""

  def __init__(self):
    self.registry = registry = CollectorRegistry()
    self.requests = Counter("elmo_requests", "Requests answered, by endpoint and HTTP status",
                            ["endpoint", "status"], registry=registry)
    self.latency = Histogram("elmo_request_seconds", "Seconds from a request's arrival to its answer",
                             ["endpoint"], buckets=_LATENCY, registry=registry)
    self.batch_requests = Histogram("elmo_batch_requests", "Requests per device batch", buckets=_COUNTS,
                                    registry=registry)
    self.batch_sentences = Histogram("elmo_batch_sentences", "Sentences per device batch", buckets=_COUNTS,
                                     registry=registry)
    self.batch_tokens = Histogram("elmo_batch_tokens", "Tokens per device batch", buckets=_TOKENS,
                                  registry=registry)
    self.batch_seconds = Histogram("elmo_batch_seconds", "Seconds the Embedder spent on a batch",
                                   buckets=_LATENCY, registry=registry)
    self.batch_padding = Histogram("elmo_batch_padding_ratio", "Share of a batch's LSTM row-steps that ran on no "
                                   "token (steps run minus steps needed, over steps run)", buckets=_SHARES,
                                   registry=registry)
    self.queue_seconds = Histogram("elmo_queue_seconds", "Seconds a request waited for its batch",
                                   buckets=_LATENCY, registry=registry)
    self.inference_seconds = Histogram("elmo_inference_seconds", "Seconds of the batch that answered a request",
                                       buckets=_LATENCY, registry=registry)
    self.queue_depth = Gauge("elmo_queue_depth", "Requests waiting for a batch", registry=registry)
    self.in_flight = Gauge("elmo_in_flight", "Requests accepted and not yet answered", registry=registry)
    self.compiles = Gauge("elmo_compiles_since_ready", "JAX traces and XLA compiles since the server was ready "
                          "(a warm server never compiles: 0)", registry=registry)
    self._counter: CompileCounter | None = None

  def ready(self) -> None:
    """From now on every JAX trace or compile in this process counts (`elmo_compiles_since_ready`)."""
    self._counter = CompileCounter().__enter__()

  @property
  def compiles_since_ready(self) -> int:
    return 0 if self._counter is None else self._counter.traces + self._counter.compiles

  def observe_batch(self, batch: BatchStats) -> None:
    self.batch_requests.observe(batch.requests)
    self.batch_sentences.observe(batch.sentences)
    self.batch_tokens.observe(batch.tokens)
    self.batch_seconds.observe(batch.seconds)
    self.batch_padding.observe(batch.padding)
    for queued in batch.queue_s:
      self.queue_seconds.observe(queued)
      self.inference_seconds.observe(batch.seconds)

  def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
    self.requests.labels(endpoint, str(status)).inc()
    self.latency.labels(endpoint).observe(seconds)

  def exposition(self, queue_depth: int, in_flight: int) -> tuple[bytes, str]:
    """The text format, with the gauges read now."""
    self.queue_depth.set(queue_depth)
    self.in_flight.set(in_flight)
    self.compiles.set(self.compiles_since_ready)
    return generate_latest(self.registry), CONTENT_TYPE_LATEST
