"""A local HTTP server for the download tests (nothing leaves 127.0.0.1) and the cache they download into."""
from __future__ import annotations

import contextlib
import functools
import http.server
import threading

import pytest


@contextlib.contextmanager
def serve(handler, directory, **attrs):
  """Serves `directory` with `handler` (a SimpleHTTPRequestHandler subclass) on a free port; yields
  (server, base URL). `attrs` are set on the server for the handler to read (e.g. which files to cut)."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
  server.requests = []
  for key, value in attrs.items():
    setattr(server, key, value)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty download cache for this test ($ELMO_JAX_CACHE)."""
  path = tmp_path / "cache"
  monkeypatch.setenv("ELMO_JAX_CACHE", str(path))
  return path
