"""uvicorn's server with a drain and deadlines for slow clients.

The first SIGTERM or SIGINT turns the service to draining (new requests 503, `/v2/health/ready` 503) and the
server exits, code 0, once the requests it accepted are answered: at most `drain_s` in all, uvicorn's own
graceful shutdown included (a second signal exits at once). A connection that has not sent a whole request's
headers within `header_timeout_s` (a fresh one, or a kept-alive one that began another) is closed: uvicorn
times out only an idle kept-alive connection, so a client that sends half its headers and waits would hold a
file descriptor for ever. A body's deadline is the app's (`app._read_body`: 408).
"""
from __future__ import annotations

import resource
import sys
import time
from types import FrameType

import uvicorn

from elmo_jax.serving.app import Service

KEEP_ALIVE_S = 5  # an idle kept-alive connection's life (uvicorn's default, said here)
SPARE_FILES = 64  # file descriptors kept for the model's files, the compilation cache, logs


def connection_limit(wanted: int = 1024) -> int:
  """Connections (and tasks) uvicorn serves at once: `wanted`, below the process's soft RLIMIT_NOFILE less
  `SPARE_FILES` (past it uvicorn answers 503 instead of failing to accept, and other clients still get in)."""
  soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft == resource.RLIM_INFINITY:
    return wanted
  return max(1, min(wanted, soft - SPARE_FILES))


class DrainingServer(uvicorn.Server):
  """`uvicorn.Server` whose exit on a signal waits for `service.in_flight` to reach 0 (at most `drain_s`), and
  which closes a connection whose request headers take over `header_timeout_s` (None: no deadline)."""

  def __init__(self, config: uvicorn.Config, service: Service, drain_s: float,
               header_timeout_s: float | None = None):
    super().__init__(config)
    self.service, self.drain_s, self.header_timeout_s = service, drain_s, header_timeout_s
    self._drain_deadline: float | None = None
    self._waiting: dict[tuple[int, int], float] = {}  # (connection, cycle) -> since when it waits for headers

  def handle_exit(self, sig: int, frame: FrameType | None) -> None:
    # uvicorn's own handler records the signal and raises it again after shutdown (exit code 128 + sig);
    # a drained server has done what was asked, so it exits 0.
    if self._drain_deadline is None:
      self.service.draining = True
      self._drain_deadline = time.monotonic() + self.drain_s
      print(f"draining: {self.service.in_flight} request(s) in flight; new ones get 503 (signal {sig}; another "
            "signal stops at once)", file=sys.stderr, flush=True)
    else:
      self.should_exit = self.force_exit = True

  async def on_tick(self, counter: int) -> bool:
    if self._drain_deadline is not None and (self.service.in_flight == 0 or time.monotonic() > self._drain_deadline):
      self.should_exit = True
    if self.header_timeout_s is not None:
      self._close_slow_headers()
    return await super().on_tick(counter)

  async def shutdown(self, sockets=None) -> None:
    # uvicorn's graceful shutdown gets what is left of the drain, not another `drain_s` of its own
    if self._drain_deadline is not None:
      self.config.timeout_graceful_shutdown = max(0.5, self._drain_deadline - time.monotonic())
    await super().shutdown(sockets)

  def _close_slow_headers(self) -> None:
    """Closes each connection that has waited for a request's headers over `header_timeout_s` (a connection
    with no request yet, or whose last response is sent: uvicorn's keep-alive timer stops at its first byte)."""
    now, waiting = time.monotonic(), {}
    for connection in list(self.server_state.connections):
      cycle = getattr(connection, "cycle", None)
      if cycle is not None and not cycle.response_complete:
        continue  # in a request: the app's deadlines hold it
      key = (id(connection), id(cycle))
      waiting[key] = since = self._waiting.get(key, now)
      transport = getattr(connection, "transport", None)
      if now - since > self.header_timeout_s and transport is not None and not transport.is_closing():
        transport.close()
    self._waiting = waiting
