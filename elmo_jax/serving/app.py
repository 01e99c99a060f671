"""The ASGI app of `elmo-jax serve` (Starlette): the Open Inference Protocol (`v2`), OpenAI's `/v1/embeddings`
(`openai_api`), health, metadata and `/metrics`, over one `Batcher`.

    app = make_app(Service(embedder, model_name="elmo"))   # uvicorn runs it (elmo_jax/cli/serve.py)

Every failure is an HTTP status and a one-line JSON error, and the server stays up: 400 for a malformed request,
401 without the server's API key (`api_key`: a bearer token; the health routes need none), 404 for another model's
name or an unknown route, 413 for a body over `max_body_bytes` or a sentence over `max_tokens`, 503 with
Retry-After for a full queue or while draining, 504 past `timeout_s`. An answer's headers say where its time went,
in milliseconds, as TEI's do: `x-queue-time` (waiting for its batch), `x-inference-time` (its batch), `x-total-time`
(from arrival to answer). One access-log line per request on stderr.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import importlib.metadata
import json
import sys
import time
import traceback
from typing import Any, Awaitable, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from elmo_jax.serving import openai_api
from elmo_jax.serving import v2
from elmo_jax.serving.batcher import Batcher, Draining, QueueFull
from elmo_jax.serving.metrics import Metrics
from elmo_jax.serving.v2 import RequestError

RETRY_AFTER_S = 1
try:
  _VERSION = importlib.metadata.version("elmo_jax")
except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
  _VERSION = "0+unknown"


class Service:
  """What the routes share: the Embedder behind its `Batcher`, the limits, the metrics, the drain state.

  Args:
    embedder: a warm, stateless `Embedder`.
    model_name: the name clients use (`/v2/models/NAME`, OpenAI's `model`).
    layer: what `sentence_vector` and `/v1/embeddings` average over the tokens ("average", "top", "all" is not a
      vector; an int layer).
    tokenize: str -> tokens for text inputs (default: split at whitespace).
    max_tokens: the longest sentence accepted (413 past it); any length runs (`embedding/long_sentence.py`).
    max_body_bytes: the largest body (413 past it).
    timeout_s: seconds from a request's arrival to its answer (504 past them).
    access_log: one line per request on stderr.
    api_key: None (every client is served), or the bearer token every route but health needs (401 without it).
    **batching: `Batcher`'s keyword arguments (max_batch_tokens, max_wait_ms, max_queue).
  """

  def __init__(self, embedder: Any, *, model_name: str = "elmo", layer: Any = "average",
               tokenize: Callable[[str], list[str]] = str.split, max_tokens: int = 512,
               max_body_bytes: int = 8 << 20, timeout_s: float = 30.0, access_log: bool = True,
               api_key: str | None = None, **batching: Any):
    self.embedder, self.model_name, self.layer, self.tokenize = embedder, model_name, layer, tokenize
    self.max_tokens, self.max_body_bytes, self.timeout_s = max_tokens, max_body_bytes, timeout_s
    self.access_log = access_log
    self.api_key = api_key
    self.metrics = Metrics()
    self.batcher = Batcher(embedder, on_batch=self.metrics.observe_batch, **batching)
    self.draining = False
    self.in_flight = self.answered = 0

  def start(self) -> None:
    """Starts the batch thread; from here on the compile counter runs (`/metrics`)."""
    self.batcher.start()
    self.metrics.ready()

  async def embed(self, sentences: list[list[str]], timing: dict[str, float] | None = None) -> list[np.ndarray]:
    """Each sentence's layers `[n_layers + 1, n_tokens, 2P]`, batched with other requests' sentences; `timing`
    gets the request's `queue_s` and `inference_s` (`Batcher.submit`)."""
    for i, s in enumerate(sentences):
      if len(s) > self.max_tokens:
        raise RequestError(f"sentence {i} has {len(s)} tokens; this server takes at most {self.max_tokens} "
                           "(--max_tokens)", 413)
    if self.draining:
      raise Draining("the server is shutting down")
    return await asyncio.wait_for(self.batcher.submit(sentences, timing), self.timeout_s)


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
  return Response(json.dumps(value).encode(), status, headers, media_type="application/json")


def _timing_headers(timing: dict[str, float]) -> dict[str, str]:
  """A request's `x-queue-time` and `x-inference-time` (ms), from what its batch recorded."""
  return {f"x-{name}-time": f"{timing[f'{name}_s'] * 1e3:.3f}" for name in ("queue", "inference")
          if f"{name}_s" in timing}


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
  """The body, refused (413) as soon as it is known to pass `limit` bytes (Content-Length, else while read),
  and 408 unless all of it arrives within `timeout_s` (a client that sends half a body and waits holds a
  connection and a file descriptor: it gets no more than a request's own time)."""
  length = request.headers.get("content-length")
  if length is not None and length.isdigit() and int(length) > limit:
    raise RequestError(f"the body has {length} bytes; this server takes at most {limit} (--max_body_bytes)", 413)
  chunks: list[bytes] = []

  async def read() -> None:
    size = 0
    async for chunk in request.stream():
      size += len(chunk)
      if size > limit:
        raise RequestError(f"the body passes {limit} bytes (--max_body_bytes)", 413)
      chunks.append(chunk)
  try:
    await asyncio.wait_for(read(), timeout_s)
  except asyncio.TimeoutError:
    raise RequestError(f"the body did not arrive within {timeout_s:g} s (--timeout_s)", 408) from None
  return b"".join(chunks)


def _endpoint(name: str, errors: Callable[[str, int], bytes] | None = None):
  """A route's common part: in-flight count, the failures as statuses with one-line JSON, metrics, access log.
  `errors`: the body of an error (default: the protocol's `{"error": MESSAGE}`)."""
  def wrap(handler: Callable[[Service, Request], Awaitable[Response]]):
    @functools.wraps(handler)
    async def route(request: Request) -> Response:
      service: Service = request.app.state.service
      start = time.perf_counter()
      service.in_flight += 1
      try:
        response = await _answer(handler, service, request, errors)
      finally:
        service.in_flight -= 1
        service.answered += 1
      seconds = time.perf_counter() - start
      response.headers["x-total-time"] = f"{seconds * 1e3:.3f}"
      service.metrics.observe_request(name, response.status_code, seconds)
      if service.access_log:
        client = f"{request.client.host}:{request.client.port}" if request.client else "-"
        print(f"{client} \"{request.method} {request.url.path}\" {response.status_code} {seconds * 1e3:.1f} ms",
              file=sys.stderr, flush=True)
      return response
    return route
  return wrap


async def _answer(handler, service: Service, request: Request, errors) -> Response:
  def error(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    body = errors(message, status) if errors else json.dumps({"error": message}).encode()
    return Response(body, status, headers, media_type="application/json")
  try:
    return await handler(service, request)
  except RequestError as e:
    return error(str(e), e.status)
  except QueueFull as e:
    return error(f"the queue is full: {e}; retry", 503, {"Retry-After": str(RETRY_AFTER_S)})
  except Draining as e:
    return error(str(e), 503, {"Retry-After": str(RETRY_AFTER_S)})
  except asyncio.TimeoutError:
    return error(f"no answer within {service.timeout_s:g} s (--timeout_s)", 504)
  except Exception as e:  # pylint: disable=broad-except  (a fault of ours: the client gets one line, the log the rest)
    traceback.print_exc(file=sys.stderr)
    return error(" ".join(f"internal error: {type(e).__name__}: {e}".split())[:300], 500)


def _check_model(service: Service, request: Request) -> None:
  name = request.path_params["name"]
  if name != service.model_name:
    raise RequestError(f"unknown model {name!r}; this server serves {service.model_name!r}"[:300], 404)
  version = request.path_params.get("version")
  if version not in (None, "1"):
    raise RequestError(f"model {name!r} has no version {version!r}; its one version is '1'"[:300], 404)


def _limits(service: Service) -> v2.Limits:
  """What one request may cost (`v2.Limits.derived` from the server's flags and the model's shape)."""
  return v2.Limits.derived(service.max_body_bytes, service.max_tokens, service.batcher.max_batch_tokens,
                           service.embedder.n_layers, service.embedder.output_dim)


@_endpoint("infer")
async def infer(service: Service, request: Request) -> Response:
  _check_model(service, request)
  body = await _read_body(request, service.max_body_bytes, service.timeout_s)
  sentences, outputs, request_id = v2.parse_infer(body, request.headers.get(v2.HEADER_LENGTH), _limits(service),
                                                  service.tokenize)
  timing: dict[str, float] = {}
  layers = await service.embed(sentences, timing)
  arrays = v2.output_arrays(layers, list(outputs), service.layer)
  content, headers = v2.response(service.model_name, request_id, arrays, outputs)
  return Response(content, 200, {**headers, **_timing_headers(timing)})


@_endpoint("embeddings", openai_api.error_body)
async def embeddings(service: Service, request: Request) -> Response:
  body = await _read_body(request, service.max_body_bytes, service.timeout_s)
  sentences, fmt = openai_api.parse(body, service.model_name, service.embedder.output_dim, service.tokenize,
                                    _limits(service))
  timing: dict[str, float] = {}
  layers = await service.embed(sentences, timing)
  arrays = v2.output_arrays(layers, ["sentence_vector"], service.layer)
  return Response(openai_api.response(arrays["sentence_vector"], sentences, fmt, service.model_name), 200,
                  _timing_headers(timing), media_type="application/json")


@_endpoint("models")
async def openai_models(service: Service, request: Request) -> Response:
  return _json({"object": "list", "data": [{"id": service.model_name, "object": "model", "created": 0,
                                            "owned_by": "elmo_jax"}]})


@_endpoint("metadata")
async def model_metadata(service: Service, request: Request) -> Response:
  _check_model(service, request)
  return _json(v2.metadata(service.model_name, service.embedder.n_layers, service.embedder.output_dim))


@_endpoint("model_ready")
async def model_ready(service: Service, request: Request) -> Response:
  _check_model(service, request)
  return _json({"name": service.model_name, "ready": not service.draining}, 503 if service.draining else 200)


@_endpoint("server")
async def server_metadata(service: Service, request: Request) -> Response:
  return _json({"name": "elmo_jax", "version": _VERSION, "extensions": ["binary_tensor_data"]})


async def live(request: Request) -> Response:
  return _json({"live": True})


async def ready(request: Request) -> Response:
  draining = request.app.state.service.draining
  return _json({"ready": not draining}, 503 if draining else 200)


async def metrics(request: Request) -> Response:
  service: Service = request.app.state.service
  content, media_type = service.metrics.exposition(service.batcher.depth, service.in_flight)
  return Response(content, 200, media_type=media_type)


async def _not_found(request: Request, exc: Exception) -> Response:
  status = getattr(exc, "status_code", 404)
  return _json({"error": f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}"}, status)


# Open without the API key: what a load balancer or Kubernetes probes ask (liveness and readiness)
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})


class BearerKey:
  """ASGI middleware: every HTTP request but `OPEN_PATHS` needs `Authorization: Bearer KEY` (compared in constant
  time: the time of a refusal says nothing of how much of a guess was right); else 401 and one line."""

  def __init__(self, app: Any, key: str):
    self.app, self._want = app, f"Bearer {key}".encode()

  async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
    if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
      return await self.app(scope, receive, send)
    given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
    if hmac.compare_digest(given, self._want):
      return await self.app(scope, receive, send)
    message = "this server needs its API key: send the header 'Authorization: Bearer KEY' (--api_key)"
    body = (openai_api.error_body(message, 401) if scope["path"].startswith("/v1/")
            else json.dumps({"error": message}).encode())
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="elmo_jax"')]})
    await send({"type": "http.response.body", "body": body})


def make_app(service: Service) -> Starlette:
  """The routes over `service` (started and stopped with the app's lifespan); behind `BearerKey` when the
  service has an API key."""
  model = "/v2/models/{name}"
  routes = [
      Route("/v2", server_metadata), Route("/v2/health/live", live), Route("/v2/health/ready", ready),
      Route(model, model_metadata), Route(model + "/versions/{version}", model_metadata),
      Route(model + "/ready", model_ready), Route(model + "/versions/{version}/ready", model_ready),
      Route(model + "/infer", infer, methods=["POST"]),
      Route(model + "/versions/{version}/infer", infer, methods=["POST"]),
      Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/v1/models", openai_models),
      Route("/metrics", metrics),
  ]
  app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_found})
  app.state.service = service
  if service.api_key:
    app.add_middleware(BearerKey, key=service.api_key)
  return app
