"""uvicorn's server with a drain: the first SIGTERM or SIGINT turns the service to draining (new requests 503,
`/v2/health/ready` 503) and the server exits, code 0, once the requests it accepted are answered (at most
`drain_s`); a second signal exits at once."""
from __future__ import annotations

import sys
import time
from types import FrameType

import uvicorn

from elmo_jax.serving.app import Service


class DrainingServer(uvicorn.Server):
  """`uvicorn.Server` whose exit on a signal waits for `service.in_flight` to reach 0."""

  def __init__(self, config: uvicorn.Config, service: Service, drain_s: float):
    super().__init__(config)
    self.service, self.drain_s = service, drain_s
    self._drain_deadline: float | None = None

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
    return await super().on_tick(counter)
