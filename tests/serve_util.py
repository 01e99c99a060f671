"""Shared helpers of the serving tests: a numpy stand-in for the Embedder (no JAX: the app's rules tested in
milliseconds), the app on a real uvicorn server in a thread, plain HTTP calls."""
from __future__ import annotations

import http.client
import json
import threading
import time
import zlib

import numpy as np


class FakeEmbedder:
  """What the server needs of an `Embedder`: layers `[3, n_tokens, 4]` from each token's crc32 (so a mix-up
  between requests shows), an optional delay per call, and the calls it got."""
  n_layers, output_dim, default_batch_size = 3, 4, 64

  def __init__(self, delay_s: float = 0.0):
    self.delay_s, self.calls = delay_s, []
    self.release = threading.Event()
    self.release.set()

  def embed_sentences(self, sentences):
    self.calls.append([list(s) for s in sentences])
    self.release.wait(30)
    time.sleep(self.delay_s)
    return [self.layers(s) for s in sentences]

  @staticmethod
  def layers(sentence) -> np.ndarray:
    out = np.zeros((3, len(sentence), 4), np.float32)
    for t, token in enumerate(sentence):
      out[:, t] = (zlib.crc32(token.encode()) % 1000) / 1000 + np.arange(12, dtype=np.float32).reshape(3, 4)
    return out


class ThreadServer:
  """`make_app(service)` on a real uvicorn server (the `DrainingServer`) in a thread, on a free port."""

  def __init__(self, service, drain_s: float = 10.0, header_timeout_s: float | None = None, **config):
    import uvicorn  # pylint: disable=g-import-not-at-top
    from elmo_jax.serving.app import make_app  # pylint: disable=g-import-not-at-top
    from elmo_jax.serving.server import DrainingServer  # pylint: disable=g-import-not-at-top
    self.service = service
    config = uvicorn.Config(make_app(service), host="127.0.0.1", port=0, log_level="warning", access_log=False,
                            lifespan="off", **config)
    self.server = DrainingServer(config, service, drain_s, header_timeout_s)
    self.thread = threading.Thread(target=self.server.run, daemon=True)

  def __enter__(self) -> "ThreadServer":
    self.service.start()
    self.thread.start()
    deadline = time.time() + 20
    while not self.server.started:
      assert time.time() < deadline, "the server did not start"
      time.sleep(0.01)
    self.port = self.server.servers[0].sockets[0].getsockname()[1]
    return self

  def __exit__(self, *exc) -> None:
    self.server.should_exit = True
    self.thread.join(20)
    self.service.batcher.stop()


def call(port: int, method: str, path: str, body: bytes | dict | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
  """One HTTP request on a new connection: (status, headers with lower-case names, body)."""
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
  try:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
  finally:
    conn.close()


def infer_json(texts: list[str], outputs=("sentence_vector",)) -> dict:
  """A JSON-form inference request of whitespace-split sentences."""
  return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}],
          "outputs": [{"name": o} for o in outputs]}


def infer_one(port: int, texts: list[str], output: str) -> tuple[int, np.ndarray | None]:
  """One JSON-form inference request: (status, `output` as an array of its shape; None unless 200)."""
  status, _, body = call(port, "POST", "/v2/models/elmo/infer", infer_json(texts, (output,)))
  if status != 200:
    return status, None
  out = json.loads(body)["outputs"][0]
  return status, np.array(out["data"], np.float32).reshape(out["shape"])


def one_line_error(body: bytes) -> str:
  """The error message of an error response; asserts it is one line of JSON."""
  assert b"\n" not in body.strip(), body
  value = json.loads(body)
  message = value["error"]["message"] if isinstance(value["error"], dict) else value["error"]
  assert isinstance(message, str) and message and "\n" not in message, value
  return message
