"""`elmo-jax serve` as a user runs it: a real process on 127.0.0.1 with bilm-tf's fixture model, read by
Triton's own Python client and by OpenAI's, the docs page's curl examples, 64 concurrent requests, and SIGTERM
with requests in flight."""
from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("uvicorn")  # the serve extra (requirements-test.txt installs it)

from elmo_jax.embedding.embedder import Embedder  # noqa: E402
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT  # noqa: E402
from serve_util import call, infer_json, infer_one  # noqa: E402
import embed_util  # noqa: E402
import fixture_models  # noqa: E402
import launch_util  # noqa: E402

pytestmark = pytest.mark.slow
SENTENCES = [s.split() for row in embed_util.SENTENCES for s in row][:12]
TOLERANCE = 1e-6  # XLA:CPU may round a row by its position in a batch (~1e-7); bit for bit in the same batch


class ServeProcess:
  """`python -m elmo_jax serve --model=FOLDER --port=0 ...` until it says ready (its port from that line)."""

  def __init__(self, model_dir: str, *flags: str, log: str, devices: int = 1):
    self.log_path = log
    self.log = open(log, "w")
    self.proc = subprocess.Popen([sys.executable, "-m", "elmo_jax", "serve", f"--model={model_dir}", "--port=0",
                                  "--batch_size=16", *flags], cwd=REPO_ROOT, stdout=self.log,
                                 stderr=subprocess.STDOUT, env=launch_util.env(devices))
    deadline = time.time() + 240
    while not (found := re.search(r"ready: http://127\.0\.0\.1:(\d+)", self.text())):
      assert self.proc.poll() is None and time.time() < deadline, self.text()[-3000:]
      time.sleep(0.2)
    self.port = int(found.group(1))

  def text(self) -> str:
    with open(self.log_path) as f:
      return f.read()

  def stop(self) -> int:
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
    code = self.proc.wait(60)
    self.log.close()
    return code


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """bilm-tf's fixture as a model folder (options.json + weights.hdf5), what `--model=FOLDER` takes."""
  return fixture_models.write_fixture_folder(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory):
  server = ServeProcess(model_dir, log=str(tmp_path_factory.mktemp("log") / "serve.log"))
  yield server
  assert server.stop() == 0, server.text()[-3000:]


@pytest.fixture(scope="module")
def reference():
  """The in-process Embedder the server's answers must equal."""
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, warm=False)


def test_tritonclient_reads_metadata_and_layers_binary_and_json(served, reference):
  import tritonclient.http as triton  # pylint: disable=g-import-not-at-top
  client = triton.InferenceServerClient(url=f"127.0.0.1:{served.port}")
  assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("elmo")
  meta = client.get_model_metadata("elmo")
  assert meta["inputs"][0]["name"] == "text" and {o["name"] for o in meta["outputs"]} >= {"layers", "top"}
  want = reference.embed_sentences(SENTENCES[:5])
  for binary in (True, False):
    text = triton.InferInput("text", [5], "BYTES")
    text.set_data_from_numpy(np.array([" ".join(s) for s in SENTENCES[:5]], dtype=object), binary_data=binary)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("layers", "lengths")]
    result = client.infer("elmo", [text], outputs=outputs)
    layers, lengths = result.as_numpy("layers"), result.as_numpy("lengths")
    assert lengths.tolist() == [len(s) for s in SENTENCES[:5]]
    for i, w in enumerate(want):
      np.testing.assert_allclose(layers[i, :, :lengths[i]], w, atol=TOLERANCE, rtol=0)
  client.close()


def test_openai_client_gets_the_sentence_vectors(served, reference):
  import openai  # pylint: disable=g-import-not-at-top
  client = openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="unused")
  texts = [" ".join(s) for s in SENTENCES[:4]]
  want = reference.sentence_vectors(SENTENCES[:4], layer="average")
  for fmt in (None, "float", "base64"):  # unasked, the client asks for base64 and decodes it itself
    reply = client.embeddings.create(model="elmo", input=texts, **({"encoding_format": fmt} if fmt else {}))
    got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") if fmt == "base64" else d.embedding
                    for d in reply.data], np.float32)
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
    assert reply.usage.prompt_tokens == sum(map(len, SENTENCES[:4]))
  with pytest.raises(openai.NotFoundError):
    client.embeddings.create(model="text-embedding-3-small", input="x")
  assert re.search(r'^127\.0\.0\.1:\d+ "POST /v1/embeddings" 404 [\d.]+ ms$', served.text(), re.M)  # access log


def test_docs_curl_and_python_examples_run(served):
  """docs/serving.md's curl lines and Python blocks, against this server (its port for the page's 8000)."""
  with open(os.path.join(REPO_ROOT, "docs", "serving.md"), encoding="utf-8") as f:
    page = f.read().replace("127.0.0.1:8000", f"127.0.0.1:{served.port}")
  examples = re.findall(r"^curl .*$", page, re.M)
  assert len(examples) >= 6, examples
  for command in examples:
    proc = subprocess.run(["bash", "-c", command], capture_output=True, timeout=60)
    assert proc.returncode == 0, (command, proc.stderr)
    assert proc.stdout.strip(), command
  blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
  assert len(blocks) == 2
  for code in blocks:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip(), (code, proc.stderr[-2000:])


def test_64_concurrent_requests_each_get_their_own_sentence_and_nothing_compiles(served, reference):
  rng = np.random.default_rng(0)
  words = sorted({w for s in SENTENCES for w in s})
  sentences = [[words[k] for k in rng.integers(len(words), size=rng.integers(1, 60))] for _ in range(64)]
  want = reference.embed_sentences(sentences)

  with concurrent.futures.ThreadPoolExecutor(64) as pool:
    results = list(pool.map(lambda s: infer_one(served.port, [" ".join(s)], "layers"), sentences))
  for w, (status, layers) in zip(want, results):
    assert status == 200
    np.testing.assert_allclose(layers[0], w, atol=TOLERANCE, rtol=0)
  metrics = call(served.port, "GET", "/metrics")[2].decode()
  assert re.search(r"^elmo_compiles_since_ready 0\.0$", metrics, re.M), metrics
  batches = float(re.search(r"^elmo_batch_requests_count (\S+)$", metrics, re.M).group(1))
  assert batches < 64 + 40  # the 64 came in fewer batches than requests (the other tests' requests included)


def test_eight_devices_answer_as_one_then_sigterm_drains_and_exits_0(model_dir, reference, tmp_path):
  """A server over 8 (simulated) devices gives one device's layers; SIGTERM with requests in flight answers
  them and exits 0."""
  server = ServeProcess(model_dir, "--noaccess_log", log=str(tmp_path / "serve.log"), devices=8)
  try:
    _eight_devices_then_sigterm(server, reference)
  finally:
    if server.proc.poll() is None:  # a failed check leaves no server behind
      server.proc.kill()


def _eight_devices_then_sigterm(server: ServeProcess, reference) -> None:
  assert "8 device(s)" in server.text()
  status, layers = infer_one(server.port, [" ".join(s) for s in SENTENCES[:10]], "layers")
  assert status == 200
  for i, w in enumerate(reference.embed_sentences(SENTENCES[:10])):
    np.testing.assert_allclose(layers[i, :, :w.shape[1]], w, atol=TOLERANCE, rtol=0)
  long = " ".join((SENTENCES[0] * 60)[:500])
  outcomes, signalled = [], threading.Event()

  def client():
    for _ in range(6):
      started_after = signalled.is_set()
      try:
        status = call(server.port, "POST", "/v2/models/elmo/infer", infer_json([long] * 8, ("top",)))[0]
      except OSError:
        status = "refused"
      outcomes.append((started_after, status, signalled.is_set()))

  threads = [threading.Thread(target=client) for _ in range(8)]
  for t in threads:
    t.start()
  time.sleep(0.5)
  server.proc.send_signal(signal.SIGTERM)
  signalled.set()
  for t in threads:
    t.join(120)
  assert server.proc.wait(60) == 0, server.text()[-2000:]
  assert "draining" in server.text() and "stopped" in server.text()
  before = [status for after, status, _ in outcomes if not after]
  assert before and set(before) <= {200, 503}, outcomes  # no request sent before the signal was dropped
  assert any(status == 200 and done_after for after, status, done_after in outcomes if not after), outcomes
  assert {status for after, status, _ in outcomes if after} <= {503, "refused"}, outcomes


def test_load_benchmark_smoke(tmp_path):
  """benchmarks/serve_load.py end to end on bilm-tf's fixture shape, a few requests a level: its JSON carries
  every row the docs' table reads (no timing is asserted)."""
  proc = subprocess.run([sys.executable, "serve_load.py", f"--options_file={FIXTURE_OPTIONS}", "--requests=12",
                         "--warmup=2", "--soak_requests=40", "--clients=1,4", "--allennlp_path=", "--batch_calls=3"],
                        cwd=os.path.join(REPO_ROOT, "benchmarks"), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout[proc.stdout.index("{"):])
  levels = result["serve"]["levels"]
  assert [lv["clients"] for lv in levels] == [1, 4] and all(lv["requests"] == 12 for lv in levels)
  assert all(not lv["failures"] for lv in levels) and result["serve"]["compiles_since_ready"] == 0
  assert result["serve"]["soak"]["requests"] == 40 and result["serve"]["soak"]["rss_mb_after"] > 0
  assert {"direct", "direct_again", "speedup_vs_direct", "http_cost_ms", "load_average_after"} <= set(result)
  assert set(result["speedup_vs_direct"]) == {"1", "4"} and result["direct"]["seen"]["sentences_per_s"] > 0
  assert all(0 <= lv["padding_share"] < 1 and 0 <= lv["generator_cpu_share"] <= 1 for lv in levels)
  for k in ("16", "64"):
    row = result["direct"]["batches"][k]
    assert row["mixed_sentences_per_s"] > 0 and row["ceiling_sentences_per_s"] > 0 and 0 <= row["padding_share"] < 1


@pytest.mark.parametrize("flags,words", [
    (["--model=x", "--stateful"], "--stateful is refused: a server's batch rows are shared by every client"),
    ([], "--model is required"),
    (["--model=x", "--max_tokens=0"], "--max_tokens must be >= 1"),
    (["--model=x", "--port=70000"], "--port must be <= 65535"),
    (["--model=x", "--timeout_s=0"], "--timeout_s must be > 0"),
    (["--model=x", "--layer=middle"], "--layer must be average, top or a layer index"),
    (["--model=/nonexistent/model"], "/nonexistent/model"),
    (["--model=x", "--host=0.0.0.0"], "--host=0.0.0.0 serves beyond this machine: give an API key"),
    (["--model=x", "--api_key= padded "], "must be printable text without surrounding spaces"),
])
def test_usage_errors_are_one_line(flags, words):
  env = {k: v for k, v in os.environ.items() if k != "ELMO_JAX_API_KEY"}
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "serve", "--port=0", *flags], capture_output=True,
                        text=True, cwd=REPO_ROOT, timeout=120, env={**env, "JAX_PLATFORMS": "cpu"})
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode != 0 and len(lines) == 1 and words in lines[0], proc.stderr[-2000:]


def test_a_taken_port_is_one_line_before_the_model_loads(served, model_dir):
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "serve", f"--model={model_dir}",
                         f"--port={served.port}"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 1 and lines == [f"error: cannot bind 127.0.0.1:{served.port}: Address already in use "
                                            "(--host, --port; --port=0 for any free port)"], proc.stderr
