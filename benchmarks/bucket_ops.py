"""What a bucket workdir costs: requests per kind of file, and wall time next to a local workdir; one JSON.

    python benchmarks/bucket_ops.py [--steps=24] [--log_every=4] [--checkpoint_every=8] [--rounds=2]

A real GCS server (fake-gcs-server, `tests/gcs_util.py`) behind a counting proxy on 127.0.0.1: every client
(gcsfs, google-cloud-storage, Orbax's tensorstore) is pointed at the proxy, which forwards each request and
counts it by operation (upload, download, metadata, list, delete, copy) and by the workdir file it names
(checkpoints/, metrics.jsonl, tensorboard/, export/, train.lock, ...). The tiny test model trains the same
steps with the workdir in the bucket and on the local disk, interleaved `--rounds` times; the JSON has the
counts per log step and per save, and the median wall times.
"""
from __future__ import annotations

import collections
import http.client
import http.server
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import gcs_util  # noqa: E402  pylint: disable=g-import-not-at-top
import launch_util  # noqa: E402  pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 24, "Training steps per run.")
flags.DEFINE_integer("log_every", 4, "config.log_every_steps.")
flags.DEFINE_integer("checkpoint_every", 8, "config.checkpoint_every_steps.")
flags.DEFINE_integer("rounds", 2, "Interleaved bucket/local rounds for the wall times.")

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def _operation(method: str, path: str, query: dict) -> str:
  if method == "DELETE":
    return "delete"
  if "/upload/" in path or method in ("PUT", "PATCH") or path.endswith("/compose"):
    return "upload"
  if "rewriteTo" in path or "copyTo" in path:
    return "copy"
  if method == "GET" and ("/download/" in path or query.get("alt") == ["media"]):
    return "download"
  if method == "GET" and path.rstrip("/").endswith("/o"):
    return "list"
  return "metadata" if method == "GET" else method.lower()


def _file_kind(path: str, query: dict, body: bytes, run: str) -> str:
  """The workdir file a request is about: its object name (in the path, `name`/`prefix` in the query, or a
  multipart upload's JSON metadata)."""
  decoded = urllib.parse.unquote(path)
  name = (query.get("name") or query.get("prefix") or [""])[0]
  if "/o/" in decoded:
    name = decoded.split("/o/", 1)[1]
  found = re.search(rb'"name"\s*:\s*"([^"]+)"', body[:4096]) if not name else None
  if found:
    name = found.group(1).decode()
  if not name.startswith(run + "/"):
    return "other"
  rel = name[len(run) + 1:].rstrip("/")
  top = rel.split("/")[0]
  if rel.startswith(".write-test-"):
    return "preflight write probe"
  return top if top in ("checkpoints", "tensorboard", "export", "prepared") else rel or "workdir"


class _Proxy(http.server.BaseHTTPRequestHandler):
  """Forwards to the emulator; counts (operation, file kind)."""
  protocol_version = "HTTP/1.1"

  def log_message(self, *args):  # quiet
    pass

  def _body(self) -> bytes:
    if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
      out = b""
      while True:
        size = int(self.rfile.readline().strip().split(b";")[0], 16)
        if size == 0:
          self.rfile.readline()
          return out
        out += self.rfile.read(size)
        self.rfile.readline()
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _forward(self) -> None:
    body = self._body()
    parsed = urllib.parse.urlparse(self.path)
    query = urllib.parse.parse_qs(parsed.query)
    server = self.server
    with server.lock:
      server.counts[(_operation(self.command, parsed.path, query),
                     _file_kind(parsed.path, query, body, server.run))] += 1
    upstream = http.client.HTTPConnection(server.upstream, timeout=60)
    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
    upstream.request(self.command, self.path, body=body, headers=headers)
    response = upstream.getresponse()
    data = response.read()
    self.send_response(response.status)
    for key, value in response.getheaders():
      if key.lower() not in _HOP:
        self.send_header(key, value)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)
    upstream.close()

  do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward


class _QuietServer(http.server.ThreadingHTTPServer):
  def handle_error(self, request, client_address):  # a client that hung up early: not the benchmark's business
    pass


def _train(workdir: str, config: str, env: dict[str, str], log: str) -> float:
  started = time.perf_counter()
  with open(log, "ab") as out:
    code = subprocess.call([sys.executable, os.path.join(REPO, "train.py"), f"--workdir={workdir}",
                            f"--config={config}", "--noprogress"], cwd=REPO, env=env, stdout=out,
                           stderr=subprocess.STDOUT)
  if code != 0:
    raise SystemExit(f"train.py exited {code}; see {log}")
  return time.perf_counter() - started


def main(argv) -> None:
  del argv
  emulator = gcs_util.start()
  root = tempfile.mkdtemp(prefix="bucket_ops_")
  proxy = _QuietServer(("127.0.0.1", 0), _Proxy)
  proxy.upstream = emulator.url.removeprefix("http://")
  proxy.counts, proxy.lock, proxy.run = collections.Counter(), threading.Lock(), ""
  threading.Thread(target=proxy.serve_forever, daemon=True).start()
  endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
  try:
    os.environ.update({**emulator.env, "ELMO_JAX_CACHE": os.path.join(root, "cache"),
                       # the runs share compiled steps (launch_util.env copies os.environ)
                       "JAX_COMPILATION_CACHE_DIR": os.path.join(root, "jax_cache"),
                       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
    train = launch_util.write_corpus(os.path.join(root, "train.txt"))
    config = launch_util.write_config(os.path.join(root, "tiny.py"), train, num_train_steps=FLAGS.steps,
                                      log_every_steps=FLAGS.log_every, checkpoint_every_steps=FLAGS.checkpoint_every)
    env = launch_util.env()
    log = os.path.join(root, "train.log")
    bucket = emulator.new_bucket()
    _train(os.path.join(root, "warm"), config, env, log)  # compiles once for all
    proxy.run = "counted"  # the counted run goes through the proxy; the timed ones talk to the server directly
    _train(f"{bucket}/counted", config, {**env, "STORAGE_EMULATOR_HOST": endpoint,
                                         "TENSORSTORE_GCS_HTTP_URL": endpoint}, log)
    counted = dict(proxy.counts)
    walls: dict[str, list[float]] = {"bucket": [], "local": []}
    for r in range(FLAGS.rounds):
      walls["bucket"].append(_train(f"{bucket}/run{r}", config, env, log))
      walls["local"].append(_train(os.path.join(root, f"local{r}"), config, env, log))
  finally:
    proxy.shutdown()
    emulator.stop()
  logs, saves = -(-FLAGS.steps // FLAGS.log_every), -(-FLAGS.steps // FLAGS.checkpoint_every)
  by_kind: dict[str, dict[str, int]] = collections.defaultdict(dict)
  for (op, kind), n in sorted(counted.items()):
    by_kind[kind][op] = n
  per = {"per_log_step": {k: {op: round(n / logs, 2) for op, n in by_kind.get(k, {}).items()}
                          for k in ("metrics.jsonl", "tensorboard")},
         "per_save": {k: {op: round(n / saves, 2) for op, n in by_kind.get(k, {}).items()}
                      for k in ("checkpoints", "export", "config.json", "vocab.txt")}}
  print(json.dumps({
      "steps": FLAGS.steps, "log_steps": logs, "saves": saves, "requests_by_file": by_kind,
      "requests_total": sum(counted.values()), **per,
      "wall_sec_median": {k: round(statistics.median(v), 2) for k, v in walls.items()},
      "wall_sec": {k: [round(x, 2) for x in v] for k, v in walls.items()},
      "note": "fake-gcs-server on 127.0.0.1: request counts are the clients' real ones; the times have no "
              "network latency (a real bucket adds about 20-50 ms per request, most of it off the step loop)",
  }, indent=2))


if __name__ == "__main__":
  app.run(main)
