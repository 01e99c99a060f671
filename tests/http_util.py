"""A local HTTP server for the download tests (nothing leaves 127.0.0.1) and the cache they download into."""
from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import socket
import threading

import pytest

from elmo_jax.sources import pretrained
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS


@contextlib.contextmanager
def serve(handler, directory, **attrs):
  """Serves `directory` with `handler` (a SimpleHTTPRequestHandler subclass) on a free port; yields
  (server, base URL). `attrs` are set on the server for the handler to read (e.g. which files to cut)."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
  server.requests = []
  for key, value in attrs.items():
    setattr(server, key, value)
  # shutdown() returns at the loop's next poll: socketserver's default of 0.5 s would add that to every test
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
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


class ModelHandler(http.server.SimpleHTTPRequestHandler):
  """Serves a folder; counts GETs; `truncate` paths send a Content-Length larger than the body."""

  def log_message(self, *args):  # keep test output clean
    pass

  def do_GET(self):  # noqa: N802
    self.server.requests.append(self.path)
    if self.path in self.server.truncate:
      body = b"x" * 100
      self.send_response(200)
      self.send_header("Content-Length", "1000")
      self.end_headers()
      self.wfile.write(body)
      self.wfile.flush()
      self.close_connection = True
      return
    super().do_GET()


def serve_models(directory):
  """`serve` with `ModelHandler` (nothing truncated)."""
  return serve(ModelHandler, directory, truncate=set())


def dead_url(path: str) -> str:
  """A URL on a local port where nothing listens (an offline machine, as far as the client can tell)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}/{path}"


def mirror(root, names=("small",)):
  """AllenNLP's bucket layout under `root`, holding the fixture model under each released name."""
  for name in names:
    m = pretrained.MODELS[name]
    folder = root / m.key
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE_OPTIONS, folder / f"elmo_{m.key}_options.json")
    shutil.copy(FIXTURE_WEIGHTS, folder / f"elmo_{m.key}_weights.hdf5")
  return root
