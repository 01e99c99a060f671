"""Counting JAX's compiles: what "no compile after load" is checked with (tests, benchmarks/embed_latency.py).

    with CompileCounter() as compiles:
      embedder.embed_sentences(sentences)
    assert compiles.traces == compiles.compiles == 0

`traces`: functions traced to a jaxpr (a jit cache miss: a new shape, also when the persistent compilation
cache then has the executable); `compiles`: XLA backend compiles (a persistent-cache miss too).
"""
from __future__ import annotations

from typing import Any

from jax import monitoring

_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_COMPILE = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
  """Counts traces and backend compiles, in this process, between `__enter__` and `__exit__`."""

  def __init__(self):
    self.traces = 0
    self.compiles = 0
    self.compile_seconds = 0.0

  def _listen(self, event: str, duration: float, **_: Any) -> None:
    if event == _TRACE:
      self.traces += 1
    elif event == _COMPILE:
      self.compiles += 1
      self.compile_seconds += duration

  def __enter__(self) -> "CompileCounter":
    monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def __exit__(self, *exc: Any) -> None:
    monitoring.unregister_event_duration_listener(self._listen)

  def as_dict(self) -> dict[str, Any]:
    return {"traces": self.traces, "compiles": self.compiles, "compile_s": round(self.compile_seconds, 3)}
