"""The serving command (`elmo-jax serve`): a warm HTTP server of ELMo layers and sentence vectors.

    elmo-jax serve --model=original                       # http://127.0.0.1:8000, model name "elmo"
    elmo-jax serve --model=runs/default --port=8080 --max_batch_tokens=8192
    elmo-jax serve --model=elmo_3/ --host=0.0.0.0 --layer=top --tokenize

`--model` is anything `embed --model=` takes (a released name, a run, a folder, an ELMoForManyLangs folder, a
TF-Hub module, a URL). The model is loaded warm (every shape compiled, or read from the compilation cache) before
the server listens and says `ready` on stderr; no request compiles. It speaks the Open Inference Protocol (KServe
v2: `/v2/health/{live,ready}`, `/v2/models/elmo`, `POST /v2/models/elmo/infer`, JSON and binary tensors) and
OpenAI's `POST /v1/embeddings`, and shows Prometheus metrics at `/metrics`. Concurrent requests are batched
(`--max_batch_tokens`, `--max_wait_ms`) over every local device. SIGTERM (or Ctrl-C) drains: accepted requests
are answered, new ones get 503, then it exits 0 (a second signal: at once). Needs the `serve` extra
(`pip install -e ".[serve]"`). Stateless: a server's rows belong to no one client, so `--stateful` is refused.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time

from absl import app
from absl import flags
from absl import logging

from elmo_jax import cli
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.embedding import host_batch
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.runtime import memory
from elmo_jax.sources import download

FLAGS = flags.FLAGS
API_KEY_ENV = "ELMO_JAX_API_KEY"
BACKLOG = 2048  # uvicorn's default backlog
MAX_WAIT_MS = 10_000  # a batch's wait for more requests; far more would stall every client (and overflow a wait)
_STATEFUL = ("--stateful is refused: a server's batch rows are shared by every client, so no row's LSTM state "
             "belongs to one caller; embed a document as one request, or use `elmo-jax embed --stateful`")


def define_flags() -> None:
  flags.DEFINE_string("model", None, "The model: a released name (small, medium, original, original_5.5B), a run, "
                      "a folder, an ELMoForManyLangs folder, a TF-Hub module or a URL.")
  flags.DEFINE_string("model_name", "elmo", "The name clients use: /v2/models/NAME, OpenAI's `model`.")
  flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: every interface).")
  flags.DEFINE_integer("port", 8000, "Port to bind (0: any free port; the ready line says which).")
  flags.DEFINE_string("layer", "average", "What sentence_vector and /v1/embeddings average over the tokens: "
                      "average (the mean of the layers), top, or a layer index (0: the char CNN's).")
  flags.DEFINE_bool("tokenize", False, "Tokenize text inputs with the trainer's Moses tokenizer (default: split "
                    "at whitespace, as the embed command reads lines).")
  flags.DEFINE_integer("max_batch_tokens", 4096, "Tokens one batch gathers at most from queued requests, "
                       "however many sentences (they are packed end to end into the warm shapes' rows).")
  flags.DEFINE_float("max_wait_ms", 2.0, "Milliseconds a batch waits for more requests under load (never for a "
                     "lone client).")
  flags.DEFINE_integer("max_queue", 256, "Requests waiting at most; past it: 503 with Retry-After.")
  flags.DEFINE_integer("max_body_bytes", 8 << 20, "Largest request body; past it: 413.")
  flags.DEFINE_integer("max_tokens", host_batch.WARM_TIME_BUCKETS[-1], "Longest sentence, in tokens; past it: "
                       "413. Past the longest time bucket a sentence runs in fixed stretches (no compile), holding "
                       "the batcher while it does.")
  flags.DEFINE_float("timeout_s", 30.0, "Seconds from a request's arrival to its answer; past them: 504.")
  flags.DEFINE_float("drain_s", 30.0, "Seconds SIGTERM waits for accepted requests before the server exits.")
  flags.DEFINE_integer("batch_size", None, "Rows per device in one batch (default 64): the warm shapes' rows, each "
                       "holding as many sentences as fit end to end.")
  flags.DEFINE_integer("devices", None, "Local devices to split each batch over (default: all of them).")
  flags.DEFINE_bool("stateful", False, "Refused (one line says why): a server is stateless.")
  flags.DEFINE_string("api_key", None, "A bearer token every request but the health checks must send "
                      "(`Authorization: Bearer KEY`; 401 without it); required when --host is not a loopback address. "
                      f"Default: ${API_KEY_ENV} (an environment variable is not shown in `ps`, a flag is).")
  flags.DEFINE_bool("access_log", True, "One line per request on stderr.")
  flags.DEFINE_bool("compilation_cache", True, "Read and keep compiled shapes in JAX's persistent compilation "
                    "cache under $ELMO_JAX_CACHE, so the next start is fast.")


def _check_flags(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if FLAGS.stateful:
    raise app.UsageError(_STATEFUL)
  if not FLAGS.model:
    raise app.UsageError("--model is required (a released name, a run, a folder or a URL)")
  cli.check_flag_numbers(
      app.UsageError,
      at_least=[(FLAGS[n], low) for n, low in (("port", 0), ("max_batch_tokens", 1), ("max_queue", 1),
                                              ("max_body_bytes", 1), ("max_tokens", 1), ("batch_size", 1),
                                              ("devices", 1))],
      within=[(FLAGS[n], "> 0 (seconds)", lambda x: x > 0) for n in ("timeout_s", "drain_s")]
      + [(FLAGS["max_wait_ms"], f"in [0, {MAX_WAIT_MS}] (milliseconds)", lambda x: 0 <= x <= MAX_WAIT_MS)])
  if FLAGS.port > 65535:
    raise app.UsageError(f"--port must be <= 65535, got {FLAGS.port}")


def is_loopback(host: str) -> bool:
  """Whether `host` (an address or a name) only ever reaches this machine."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host.strip("[]")).is_loopback
  except ValueError:
    return False


def _api_key() -> str | None:
  """--api_key, else $ELMO_JAX_API_KEY; off loopback one is required (a copied `--host=0.0.0.0` must not serve the
  whole network)."""
  key = FLAGS.api_key if FLAGS.api_key is not None else os.environ.get(API_KEY_ENV)
  if key is not None and (not key.strip() or key != key.strip() or not key.isprintable()):
    raise app.UsageError("--api_key (or $ELMO_JAX_API_KEY) must be printable text without surrounding spaces")
  if not key and not is_loopback(FLAGS.host):
    raise app.UsageError(f"--host={FLAGS.host} serves beyond this machine: give an API key (--api_key=KEY or "
                         f"${API_KEY_ENV}; clients send 'Authorization: Bearer KEY'), or bind 127.0.0.1")
  return key or None


def _layer() -> str | int:
  value = FLAGS.layer
  if value in ("average", "top"):
    return value
  try:
    return int(value)
  except ValueError:
    raise app.UsageError(f"--layer must be average, top or a layer index, got {value!r}") from None


def _bind() -> socket.socket:
  """The listening address, bound and listening before the model loads: a taken port is one line at once, not
  after it (two sockets bound with SO_REUSEADDR share a port until one listens). A connection made while the
  model loads waits in the backlog until the server is ready."""
  family = socket.AF_INET6 if ":" in FLAGS.host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((FLAGS.host, FLAGS.port))
  except OSError as e:
    sock.close()
    raise OSError(f"cannot bind {FLAGS.host}:{FLAGS.port}: {e.strerror} (--host, --port; --port=0 for any free "
                  "port)") from None
  try:
    sock.listen(BACKLOG)
  except OSError as e:
    sock.close()
    raise OSError(f"cannot listen on {FLAGS.host}:{FLAGS.port}: {e.strerror} (another server there? --port)"
                  ) from None
  return sock


def _check_layer(layer: str | int, n_layers: int) -> None:
  """--layer against the loaded model's layers (one line before the server listens, not a 500 per request)."""
  if isinstance(layer, int) and not -n_layers <= layer < n_layers:
    raise app.UsageError(f"--layer={layer}: the model has {n_layers} layers (0 .. {n_layers - 1}, -1 for the top)")


def main(argv: list[str]) -> int:
  _check_flags(argv)
  layer = _layer()
  api_key = _api_key()
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    import uvicorn  # pylint: disable=g-import-not-at-top
    # serving/ needs the serve extra (starlette, uvicorn): imported where its absence is said in one line
    from elmo_jax.serving import app as serving  # pylint: disable=g-import-not-at-top
    from elmo_jax.serving import server as server_lib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    print(f"error: `elmo-jax serve` needs the serve extra ({e.name} is missing): pip install -e \".[serve]\"",
          file=sys.stderr)
    return 1
  with cli.exit_on_interrupt():  # until the server's own handlers take over: nothing to save, nothing to drain
    try:
      sock = _bind()
      start = time.perf_counter()
      embedder = Embedder.from_pretrained(FLAGS.model, warm=True, devices=FLAGS.devices,
                                          compilation_cache=FLAGS.compilation_cache,
                                          **({"batch_size": FLAGS.batch_size} if FLAGS.batch_size else {}))
    except (OSError, ValueError, download.DownloadError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 1
    _check_layer(layer, embedder.n_layers)
    tokenize = str.split
    if FLAGS.tokenize:
      tokenize = Tokenizer()
    service = serving.Service(
        embedder, model_name=FLAGS.model_name, layer=layer, tokenize=tokenize, max_tokens=FLAGS.max_tokens,
        max_body_bytes=FLAGS.max_body_bytes, timeout_s=FLAGS.timeout_s, access_log=FLAGS.access_log, api_key=api_key,
        max_batch_tokens=FLAGS.max_batch_tokens, max_wait_ms=FLAGS.max_wait_ms, max_queue=FLAGS.max_queue)
    config = uvicorn.Config(serving.make_app(service), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=int(FLAGS.drain_s) + 1, backlog=BACKLOG,
                            timeout_keep_alive=server_lib.KEEP_ALIVE_S, limit_concurrency=server_lib.connection_limit())
    server = server_lib.DrainingServer(config, service, FLAGS.drain_s, header_timeout_s=FLAGS.timeout_s)
    host, port = sock.getsockname()[:2]
    memory.freeze_loaded_objects()  # the model and the runtime stay for the process's life: out of the GC's full passes
    service.start()
    print(f"ready: http://{host}:{port} serves {FLAGS.model_name!r} ({FLAGS.model}: {embedder.n_layers} layers x "
          f"{embedder.output_dim}, {len(embedder.devices)} device(s), loaded in {time.perf_counter() - start:.1f} s)",
          file=sys.stderr, flush=True)
  try:
    server.run(sockets=[sock])
  finally:
    service.batcher.stop()
  print(f"stopped: answered {service.answered} requests", file=sys.stderr)
  return 0


def run() -> None:
  cli.run_main(main, define_flags)
