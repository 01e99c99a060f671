"""Load on `elmo-jax serve` and what a batch costs the `Embedder`, in one run: a bounded closed-loop load generator
on 127.0.0.1 next to sequential direct calls; prints one JSON object.

    python benchmarks/serve_load.py [--preset=small] [--clients=1,4,16,64] [--requests=600] [--soak_requests=20000]

Random weights of the preset's released shape (speed does not depend on the values) in a temporary model folder,
real sentences from the corpus in data/, one sentence per request. In order, on one machine:
  * `direct`: a warm `Embedder` in this process, `embed_sentences([s])` one call after another on sentences it has
    not seen (`--requests` calls after `--warmup`), with AllenNLP's `Elmo` called the same way interleaved call by
    call where `--allennlp_path` holds it (`baseline_ms`); sentences per second and ms p50/p95/p99/max;
    `direct_seen`: the same sentences again (every token already in the token table);
  * `batches`: the same Embedder, every token in its table: `--batch_rows` (16, 64) different consecutive real
    sentences in one call (packed into rows), next to the same-length ceiling -- as many copies of one sentence of
    the groups' mean length in one call (no padding to waste) -- interleaved call by call; sentences/s of each,
    their ratio, the padding share of the packed calls;
  * `serve`: `python -m elmo_jax serve --model=FOLDER` with its defaults (access log on; `--server_flags` adds
    flags), its load time, then per client count a closed loop -- each client one keep-alive connection, its next
    request sent when its answer came -- of `sentence_vector` requests (JSON) on sentences no phase used:
    sentences per second, ms percentiles, requests per batch and the padding share of the batches (from
    `/metrics`), and this load generator's own CPU share (it shares the cores with the server); at 1 client also
    `layers` in the binary extension and in JSON; `http_cost`: the same sentences, warm in both token tables, a
    direct call and each request kind interleaved (`http_cost_ms`: the requests' p50 minus the direct one);
  * `soak`: `--soak_requests` more at the highest client count over 2,000 sentences (their tokens new in the
    first quarter only); the server's RSS after the warm-up and after each quarter (`rss_mb`);
  * `direct_again`: the direct calls again (the machine's drift between the two);
  * `speedup_vs_direct`: each client count's sentences/s over `direct`'s (one run: both sides measured here);
  * `compiles_since_ready` from `/metrics` (0: no request compiled), the load average before and after.
Every loop is bounded by its request count and `--deadline_s`: the generator stops by itself.
"""
from __future__ import annotations

import functools
import http.client
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Sequence

from absl import app
from absl import flags
import numpy as np

from bench_util import clock, load_sentences, memory_mb, stats

FLAGS = flags.FLAGS
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
flags.DEFINE_string("preset", "small", "options preset (small | medium | original).")
flags.DEFINE_string("options_file", None, "an options.json instead of the preset (e.g. a tiny smoke test).")
flags.DEFINE_list("clients", ["1", "4", "16", "64"], "concurrent clients per level.")
flags.DEFINE_list("batch_rows", ["16", "64"], "sentences per call of the `batches` phase.")
flags.DEFINE_integer("batch_calls", 30, "timed calls per kind and size in the `batches` phase.")
flags.DEFINE_integer("requests", 600, "requests per level (and direct calls).")
flags.DEFINE_integer("warmup", 50, "untimed requests or calls first.")
flags.DEFINE_integer("soak_requests", 20000, "requests of the RSS soak at the highest client count (0: none).")
flags.DEFINE_float("deadline_s", 600, "seconds any one loop may take before it stops.")
flags.DEFINE_string("corpus", os.path.join(_ROOT, "data", "pd-small", "train.txt.gz"), "one sentence per line.")
flags.DEFINE_list("server_flags", [], "more flags for the server (e.g. --max_wait_ms=5), comma-separated.")
flags.DEFINE_string("allennlp_path", "/tmp/allennlp_pkg", "pip --target folder holding allennlp 2.10.1 "
                    "(benchmarks/allennlp_baseline.py); empty or missing: no baseline.")


def write_model(folder: str) -> tuple[dict[str, Any], Any]:
  """Random weights of the preset's shape as options.json + weights.hdf5 in `folder`."""
  import jax  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import weights as weights_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.model import BiLM, BiLMConfig  # pylint: disable=g-import-not-at-top
  options = options_lib.validate(options_lib.load(FLAGS.options_file) if FLAGS.options_file
                                 else options_lib.preset(FLAGS.preset))
  dummy = np.zeros((1, 1, options["char_cnn"]["max_characters_per_token"]), np.int32)
  params = jax.device_get(jax.jit(BiLM(BiLMConfig.from_options(options)).init)(jax.random.key(0), dummy)["params"])
  options_lib.save(options, os.path.join(folder, "options.json"))
  weights_lib.save_hdf5(os.path.join(folder, "weights.hdf5"), params, options)
  return options, params


class Fresh:
  """Hands out sentences no earlier phase used: every timed loop meets new tokens as a real stream does (a
  token table warm from an earlier loop's sentences would flatter the later one)."""

  def __init__(self, sentences: list[list[str]]):
    self.sentences, self.at = sentences, 0

  def take(self, n: int) -> list[list[str]]:
    if self.at + n > len(self.sentences):
      raise SystemExit(f"--corpus has {len(self.sentences)} usable sentences, fewer than the phases take")
    self.at += n
    return self.sentences[self.at - n:self.at]


def embedder(folder: str) -> Any:
  """A warm Embedder of the model in `folder`, as a script would load it."""
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  return Embedder.from_files(os.path.join(folder, "options.json"), os.path.join(folder, "weights.hdf5"))


def direct(folder: str, sentences: list[list[str]], with_baseline: bool) -> dict[str, Any]:
  """Sequential single-sentence calls of a new warm Embedder (and AllenNLP's Elmo interleaved): `--warmup`
  calls, then one timed call per sentence left."""
  emb = embedder(folder)
  other = None
  if with_baseline and FLAGS.allennlp_path and os.path.isdir(FLAGS.allennlp_path):
    from allennlp_baseline import AllenNLPElmo  # pylint: disable=g-import-not-at-top
    other = AllenNLPElmo(FLAGS.allennlp_path, os.path.join(folder, "options.json"),
                         os.path.join(folder, "weights.hdf5"))
  for s in sentences[:FLAGS.warmup]:
    emb.embed_sentences([s])
    if other is not None:
      other([s])
  ours, theirs = [], []
  start = time.perf_counter()
  for k, s in enumerate(sentences[FLAGS.warmup:]):
    if other is not None and k % 2:
      theirs.append(clock(lambda: other([s])))
    ours.append(clock(lambda: emb.embed_sentences([s])))
    if other is not None and not k % 2:
      theirs.append(clock(lambda: other([s])))
  out = {"ms": stats(ours), "sentences_per_s": round(len(ours) / (sum(ours) / 1e3), 1),
         "wall_s": round(time.perf_counter() - start, 1)}
  if theirs:
    out["baseline"] = "allennlp==2.10.1 Elmo (benchmarks/allennlp_baseline.py), stateful as it defaults"
    out["baseline_ms"] = stats(theirs)
    out["baseline_sentences_per_s"] = round(len(theirs) / (sum(theirs) / 1e3), 1)
  if with_baseline:  # the same sentences again, every token in the table now
    seen = [clock(lambda: emb.embed_sentences([s])) for s in sentences[FLAGS.warmup:]]
    out["seen"] = {"ms": stats(seen), "sentences_per_s": round(len(seen) / (sum(seen) / 1e3), 1)}
    out["batches"] = batches(emb, sentences)
  return out


def batches(emb: Any, sentences: list[list[str]]) -> dict[str, Any]:
  """Per size k of `--batch_rows`: k different consecutive real sentences in one call, and the same-length ceiling
  (k copies of one real sentence of the groups' mean length), every token already in the table, interleaved call
  by call: sentences/s of each, their ratio, the packed calls' padding share (`Embedder.row_steps`)."""
  out = {}
  for k in map(int, FLAGS.batch_rows):
    groups = [[sentences[(i * k + j) % len(sentences)] for j in range(k)] for i in range(FLAGS.batch_calls + 2)]
    mean = round(float(np.mean([len(s) for g in groups for s in g])))
    same = [s[:mean] for s in sentences if len(s) >= mean][:len(groups)]
    same = [[s] * k for s in same]
    for g in groups[:2] + same[:2]:  # warm: their tokens into the table, the shapes' first runs
      emb.embed_sentences(g)
    mixed, ceiling, run, needed = [], [], 0, 0
    for g, c in zip(groups[2:], same[2:]):
      before = list(emb.row_steps)
      mixed.append(clock(lambda: emb.embed_sentences(g)))
      run, needed = run + emb.row_steps[0] - before[0], needed + emb.row_steps[1] - before[1]
      ceiling.append(clock(lambda: emb.embed_sentences(c)))
    rate = lambda ms: round(k / (float(np.median(ms)) / 1e3), 1)
    out[str(k)] = {"mixed_sentences_per_s": rate(mixed), "ceiling_sentences_per_s": rate(ceiling),
                   "ratio_to_ceiling": round(rate(mixed) / rate(ceiling), 2), "ceiling_tokens": mean,
                   "mixed_ms": stats(mixed), "ceiling_ms": stats(ceiling),
                   "padding_share": round(1 - needed / run, 3) if run else 0.0}
  return out


def _request(kind: str, sentence: Sequence[str]) -> tuple[bytes, dict[str, str]]:
  """One sentence's inference request: `sentence_vector` (JSON), `layers` binary or JSON."""
  text = " ".join(sentence)
  if kind == "layers_binary":
    raw = len(text.encode()).to_bytes(4, "little") + text.encode()
    head = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "layers", "parameters": {"binary_data": True}}]}).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}
  output = "layers" if kind == "layers_json" else "sentence_vector"
  return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}],
                     "outputs": [{"name": output}]}).encode(), {}


def closed_loop(port: int, sentences: list[list[str]], clients: int, n: int, kind: str = "vector") -> dict:
  """`clients` threads, each on its own keep-alive connection, `n` requests in all (over `sentences`, cycling);
  ms and sentences/s."""
  latencies: list[float] = []
  failures: list[Any] = []
  counter = iter(range(n))
  lock = threading.Lock()
  deadline = time.perf_counter() + FLAGS.deadline_s

  def client() -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while time.perf_counter() < deadline:
      with lock:
        k = next(counter, None)
      if k is None:
        break
      body, headers = _request(kind, sentences[k % len(sentences)])
      start = time.perf_counter()
      conn.request("POST", "/v2/models/elmo/infer", body, headers)
      response = conn.getresponse()
      response.read()
      ms = (time.perf_counter() - start) * 1e3
      with lock:
        (latencies if response.status == 200 else failures).append(ms if response.status == 200
                                                                   else response.status)
    conn.close()

  threads = [threading.Thread(target=client) for _ in range(clients)]
  start, cpu = time.perf_counter(), os.times()
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  wall, cpu_after = time.perf_counter() - start, os.times()
  used = cpu_after.user + cpu_after.system - cpu.user - cpu.system
  return {"clients": clients, "requests": len(latencies), "failures": failures[:10],
          "sentences_per_s": round(len(latencies) / wall, 1), "ms": stats(latencies),
          "generator_cpu_share": round(used / wall / os.cpu_count(), 3)}  # of the machine's cores


def http_cost(port: int, emb: Any, sentences: list[list[str]]) -> dict[str, Any]:
  """What HTTP adds to a call: the same sentences, each already embedded once by both (the tokens in both token
  tables), then per sentence a direct `embed_sentences([s])` and one request of each kind, interleaved; ms of
  each and the requests' p50 minus the direct call's."""
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
  kinds = ("vector", "layers_binary", "layers_json")

  def request(kind: str, sentence: list[str]) -> None:
    body, headers = _request(kind, sentence)
    conn.request("POST", "/v2/models/elmo/infer", body, headers)
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status

  for s in sentences:
    emb.embed_sentences([s])
    for kind in kinds:
      request(kind, s)
  times: dict[str, list[float]] = {"direct": [], **{k: [] for k in kinds}}
  calls = {"direct": lambda s: emb.embed_sentences([s]), **{k: functools.partial(request, k) for k in kinds}}
  order = list(calls)
  for i, s in enumerate(sentences):  # the order rotates: none always runs first after a pause, or after another
    for name in order[i % len(order):] + order[:i % len(order)]:
      times[name].append(clock(lambda: calls[name](s)))
  conn.close()
  ms = {k: stats(v) for k, v in times.items()}
  return {"ms": ms, "cost_p50_ms": {k: round(ms[k]["p50"] - ms["direct"]["p50"], 2) for k in kinds}}


def _metric(port: int, name: str) -> float:
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
  conn.request("GET", "/metrics")
  text = conn.getresponse().read().decode()
  conn.close()
  return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


_BATCH_METRICS = ("elmo_batch_requests_count", "elmo_batch_padding_ratio_sum", "elmo_batch_padding_ratio_count")


def serve(folder: str, fresh: Fresh) -> dict[str, Any]:
  """The server's load, each client level, the 1-client layers rows, the HTTP cost and the soak."""
  log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
  start = time.perf_counter()
  proc = subprocess.Popen([sys.executable, "-m", "elmo_jax", "serve", f"--model={folder}", "--port=0",
                           *FLAGS.server_flags], cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT)
  try:
    while not (found := re.search(r"ready: http://127\.0\.0\.1:(\d+)", open(log.name).read())):
      if proc.poll() is not None or time.perf_counter() - start > FLAGS.deadline_s:
        raise SystemExit(f"the server did not start:\n{open(log.name).read()[-3000:]}")
      time.sleep(0.1)
    port = int(found.group(1))
    out: dict[str, Any] = {"ready_s": round(time.perf_counter() - start, 1)}
    closed_loop(port, fresh.take(FLAGS.warmup * 4), 4, FLAGS.warmup * 4)
    levels = []
    for clients in map(int, FLAGS.clients):
      counts = {n: _metric(port, n) for n in _BATCH_METRICS}
      level = closed_loop(port, fresh.take(FLAGS.requests), clients, FLAGS.requests)
      delta = {n: _metric(port, n) - counts[n] for n in _BATCH_METRICS}
      level["mean_batch_requests"] = round(level["requests"] / max(delta["elmo_batch_requests_count"], 1), 2)
      level["padding_share"] = round(delta["elmo_batch_padding_ratio_sum"]
                                     / max(delta["elmo_batch_padding_ratio_count"], 1), 3)
      levels.append(level)
    out["levels"] = levels
    for kind in ("layers_binary", "layers_json"):
      out[f"one_client_{kind}"] = closed_loop(port, fresh.take(FLAGS.requests), 1, FLAGS.requests, kind)
    out["http_cost"] = http_cost(port, embedder(folder), fresh.take(min(FLAGS.requests, 200)))
    if FLAGS.soak_requests:
      top = max(map(int, FLAGS.clients))
      rss = [memory_mb(proc.pid)["rss"]]  # after the warm-up and the levels, then after each quarter of the soak
      sentences, quarters = fresh.take(min(FLAGS.soak_requests, 2000)), []
      for _ in range(4):
        quarters.append(closed_loop(port, sentences, top, FLAGS.soak_requests // 4))
        rss.append(memory_mb(proc.pid)["rss"])
      out["soak"] = {"clients": top, "requests": sum(q["requests"] for q in quarters),
                     "failures": [f for q in quarters for f in q["failures"]],
                     "sentences_per_s": [q["sentences_per_s"] for q in quarters],
                     "ms_p99": [q["ms"]["p99"] for q in quarters], "rss_mb": rss,
                     "rss_mb_before": rss[0], "rss_mb_after": rss[-1]}
    out["compiles_since_ready"] = _metric(port, "elmo_compiles_since_ready")
    return out
  finally:
    proc.terminate()
    out_code = proc.wait(120)
    if out_code:
      print(f"the server exited {out_code}", file=sys.stderr)
    os.unlink(log.name)


def main(argv: Sequence[str]) -> None:
  del argv
  from elmo_jax.runtime import memory  # pylint: disable=g-import-not-at-top
  memory.reuse_freed_memory()  # as every command (the server too) sets up its process: the direct calls alike
  load_before = os.getloadavg()
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=_ROOT,
                          check=False).stdout.strip()
  levels = len(FLAGS.clients) + 2  # and the two 1-client layers rows
  sentences = load_sentences(FLAGS.corpus, FLAGS.warmup * 6 + FLAGS.requests * (levels + 2) + 2200, max_len=120)
  fresh = Fresh(sentences)
  result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "commit": commit,
                            "preset": "custom" if FLAGS.options_file else FLAGS.preset,
                            "median_tokens": float(np.median([len(s) for s in sentences])),
                            "load_average_before": [round(x, 2) for x in load_before]}
  with tempfile.TemporaryDirectory() as folder:
    write_model(folder)
    result["direct"] = direct(folder, fresh.take(FLAGS.warmup + FLAGS.requests), with_baseline=True)
    result["serve"] = serve(folder, fresh)
    result["direct_again"] = direct(folder, fresh.take(FLAGS.warmup + FLAGS.requests), with_baseline=False)
  direct_rate = result["direct"]["sentences_per_s"]
  result["speedup_vs_direct"] = {str(lv["clients"]): round(lv["sentences_per_s"] / direct_rate, 2)
                                 for lv in result["serve"]["levels"]}
  result["http_cost_ms"] = result["serve"]["http_cost"]["cost_p50_ms"]
  result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  app.run(main)
