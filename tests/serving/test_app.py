"""The server's rules on a real uvicorn server over a numpy stand-in for the Embedder (serve_util.FakeEmbedder):
both protocols' shapes and encodings, every failure a status with a one-line JSON error while the server stays
up, requests never mixed, the queue bound, timeouts, and the drain a signal starts."""
from __future__ import annotations

import base64
import concurrent.futures
import json
import signal
import struct
import time

import numpy as np
import pytest

pytest.importorskip("uvicorn")  # the serve extra (requirements-test.txt installs it)

from elmo_jax.serving import v2  # noqa: E402
from elmo_jax.serving.app import Service  # noqa: E402
from serve_util import FakeEmbedder, ThreadServer, call, infer_json, infer_one, one_line_error  # noqa: E402

INFER = "/v2/models/elmo/infer"


def _service(embedder=None, **kwargs) -> Service:
  return Service(embedder or FakeEmbedder(), access_log=False, **kwargs)


@pytest.fixture(scope="module")
def server():
  with ThreadServer(_service(max_tokens=20, max_body_bytes=4096)) as s:
    yield s


def _binary_request(texts: list[str], outputs: dict[str, bool]) -> tuple[bytes, dict[str, str]]:
  raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
  head = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                                 "parameters": {"binary_data_size": len(raw)}}],
                     "outputs": [{"name": k, "parameters": {"binary_data": b}} for k, b in outputs.items()]}).encode()
  return head + raw, {v2.HEADER_LENGTH: str(len(head)), "content-type": "application/octet-stream"}


def test_json_and_binary_outputs_are_each_sentences_own(server):
  texts = ["the cat sat", "a b c d e", "x"]
  want = [FakeEmbedder.layers(t.split()) for t in texts]
  status, _, body = call(server.port, "POST", INFER, infer_json(texts, ("layers", "lengths", "sentence_vector")))
  assert status == 200
  out = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in json.loads(body)["outputs"]}
  assert out["lengths"].tolist() == [3, 5, 1] and out["layers"].shape == (3, 3, 5, 4)
  for i, w in enumerate(want):
    np.testing.assert_array_equal(out["layers"][i, :, :w.shape[1]], w)
    assert not out["layers"][i, :, w.shape[1]:].any()  # zeros past a sentence's length
    np.testing.assert_allclose(out["sentence_vector"][i], w.mean(axis=0).mean(axis=0), rtol=1e-6)
  data, headers = _binary_request(texts, {"top": True, "average": False})
  status, head, body = call(server.port, "POST", INFER, data, headers)
  assert status == 200 and head["content-type"] == "application/octet-stream"
  n = int(head[v2.HEADER_LENGTH.lower()])
  meta = json.loads(body[:n])
  top_meta, avg_meta = meta["outputs"]
  assert top_meta["name"] == "top" and top_meta["parameters"]["binary_data_size"] == 3 * 5 * 4 * 4
  top = np.frombuffer(body[n:], "<f4").reshape(top_meta["shape"])
  np.testing.assert_array_equal(top[1], want[1][-1])
  np.testing.assert_allclose(np.array(avg_meta["data"]).reshape(avg_meta["shape"])[0, :3], want[0].mean(0), rtol=1e-6)


def test_token_rows_and_openai_embeddings(server):
  request = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 3],
                         "data": [["New", "York", ""], ["is", "big", "."]]}], "outputs": [{"name": "lengths"}]}
  status, _, body = call(server.port, "POST", INFER, request)
  assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 3]
  status, _, body = call(server.port, "POST", "/v1/embeddings",
                         {"model": "elmo", "input": ["the cat", ""], "encoding_format": "base64"})
  assert status == 200
  reply = json.loads(body)
  assert reply["usage"] == {"prompt_tokens": 2, "total_tokens": 2} and reply["model"] == "elmo"
  first = np.frombuffer(base64.b64decode(reply["data"][0]["embedding"]), "<f4")
  np.testing.assert_allclose(first, FakeEmbedder.layers(["the", "cat"]).mean(0).mean(0), rtol=1e-6)
  assert not np.frombuffer(base64.b64decode(reply["data"][1]["embedding"]), "<f4").any()  # no tokens: zeros
  status, _, body = call(server.port, "GET", "/v2/models/elmo")
  assert status == 200 and json.loads(body)["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]


@pytest.mark.parametrize("method,path,body,headers,status,words", [
    ("POST", INFER, b"{not json", None, 400, "not JSON"),
    ("POST", INFER, b'{"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]}', None, 400,
     "BYTES"),
    ("POST", INFER, b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}', None, 400,
     "holds 2 elements"),
    ("POST", INFER, b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1,1,1], "data": ["a"]}]}', None,
     400, "shape"),
    ("POST", INFER, b'{"inputs": [{"name": "words", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}', None, 400,
     "unknown input"),
    ("POST", INFER, b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], '
                    b'"outputs": [{"name": "logits"}]}', None, 400, "unknown output"),
    ("POST", INFER, '{"inputs": "\xe9"}'.encode("latin-1"), None, 400, "not UTF-8"),
    ("POST", INFER, b"x" * 5000, None, 413, "max_body_bytes"),
    ("POST", INFER, json.dumps(infer_json([" ".join(["w"] * 21)])).encode(), None, 413, "max_tokens"),
    ("POST", INFER, b'{"inputs": []}', {v2.HEADER_LENGTH: "999"}, 400, "Inference-Header-Content-Length"),
    ("POST", "/v2/models/bert/infer", json.dumps(infer_json(["a"])).encode(), None, 404, "unknown model"),
    ("GET", "/v2/models/bert", None, None, 404, "unknown model"),
    ("GET", "/v2/models/elmo/versions/2", None, None, 404, "no version '2'"),
    ("GET", "/v3/nothing", None, None, 404, "/v3/nothing"),
    ("POST", "/v1/embeddings", b'{"model": "gpt", "input": "a"}', None, 404, "not served here"),
    ("POST", "/v1/embeddings", b'{"model": "elmo", "input": [1, 2]}', None, 400, "token ids"),
    ("POST", "/v1/embeddings", b'{"model": "elmo", "input": "a", "dimensions": 3}', None, 400, "dimensions"),
])
def test_each_failure_is_a_status_and_one_line_and_the_server_stays_up(server, method, path, body, headers,
                                                                        status, words):
  got, _, reply = call(server.port, method, path, body, headers)
  assert got == status, reply
  assert words in one_line_error(reply)
  assert call(server.port, "GET", "/v2/health/live")[0] == 200


def test_a_failing_embedder_is_a_500_with_one_line_and_the_server_stays_up():
  class Failing(FakeEmbedder):
    def embed_sentences(self, sentences):
      if any("boom" in s for s in sentences):
        raise RuntimeError("device lost\nsecond line")
      return super().embed_sentences(sentences)

  with ThreadServer(_service(Failing())) as s:
    status, _, body = call(s.port, "POST", INFER, infer_json(["boom"]))
    assert status == 500 and one_line_error(body) == "internal error: RuntimeError: device lost second line"
    assert call(s.port, "POST", INFER, infer_json(["fine"]))[0] == 200


def test_binary_bytes_that_lie_or_are_not_utf8_are_400(server):
  data, headers = _binary_request(["ok"], {"lengths": False})
  cut = data[:-1]  # an element's bytes cut short
  assert call(server.port, "POST", INFER, cut, headers)[0] == 400
  bad, headers = _binary_request(["ab"], {"lengths": False})
  bad = bad[:-2] + b"\xff\xfe"  # the element's two bytes, not UTF-8
  status, _, reply = call(server.port, "POST", INFER, bad, headers)
  assert status == 400 and "not UTF-8" in one_line_error(reply)


def test_64_concurrent_requests_get_their_own_sentences_in_few_batches():
  embedder = FakeEmbedder(delay_s=0.01)
  with ThreadServer(_service(embedder)) as s:
    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{rng.integers(1000)}" for _ in range(rng.integers(1, 30))) for _ in range(64)]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
      results = list(pool.map(lambda text: infer_one(s.port, [text], "top"), texts))
  for text, (status, top) in zip(texts, results):
    assert status == 200
    np.testing.assert_array_equal(top[0], FakeEmbedder.layers(text.split())[-1])
  assert sum(len(c) for c in embedder.calls) == 64 and len(embedder.calls) < 64  # batched


def test_full_queue_is_503_with_retry_after_and_a_late_answer_504():
  embedder = FakeEmbedder()
  with ThreadServer(_service(embedder, max_queue=1, timeout_s=1.0)) as s:
    embedder.release.clear()  # the first batch blocks in the Embedder
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      first = pool.submit(call, s.port, "POST", INFER, infer_json(["a"]))
      _wait(lambda: len(embedder.calls) == 1)
      second = pool.submit(call, s.port, "POST", INFER, infer_json(["b"]))  # queued behind it
      _wait(lambda: s.service.batcher.depth == 1)
      status, head, body = call(s.port, "POST", INFER, infer_json(["c"]))
      assert status == 503 and head["retry-after"] == "1" and "queue is full" in one_line_error(body)
      assert first.result()[0] == 504 and second.result()[0] == 504  # past --timeout_s while blocked
      embedder.release.set()
    assert call(s.port, "POST", INFER, infer_json(["d"]))[0] == 200  # still serving


def test_a_signal_drains_accepted_requests_then_stops():
  embedder = FakeEmbedder()
  s = ThreadServer(_service(embedder))
  with s:
    embedder.release.clear()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
      accepted = [pool.submit(call, s.port, "POST", INFER, infer_json([t])) for t in ("a", "b", "c")]
      _wait(lambda: s.service.in_flight == 3)
      s.server.handle_exit(signal.SIGTERM, None)
      assert call(s.port, "GET", "/v2/health/ready")[0] == 503
      status, head, body = call(s.port, "POST", "/v1/embeddings", {"model": "elmo", "input": "x"})
      assert status == 503 and "shutting down" in one_line_error(body)
      embedder.release.set()
      assert [f.result()[0] for f in accepted] == [200, 200, 200]
    s.thread.join(10)
    assert not s.thread.is_alive()  # it stopped by itself once the accepted requests were answered


def _wait(condition, timeout: float = 10.0) -> None:
  deadline = time.time() + timeout
  while not condition():
    assert time.time() < deadline, "timed out"
    time.sleep(0.005)


def test_a_batch_waits_for_as_many_as_were_outstanding_and_a_lone_request_never_waits():
  import asyncio  # pylint: disable=g-import-not-at-top
  from elmo_jax.serving.batcher import Batcher  # pylint: disable=g-import-not-at-top
  embedder = FakeEmbedder()
  batcher = Batcher(embedder, max_wait_ms=5000)

  async def scenario():
    start = time.perf_counter()
    await batcher.submit([["alone"]])  # nothing was outstanding before: runs at once, not after max_wait_ms
    assert time.perf_counter() - start < 2.0
    embedder.release.clear()  # the next batch blocks while three more requests arrive: three outstanding
    first = batcher.submit([["a"]])
    _wait(lambda: len(embedder.calls) == 2)
    late = [batcher.submit([[w]]) for w in ("b", "c")]
    embedder.release.set()
    await first
    third = batcher.submit([["d"]])  # b, c waited for it: three were outstanding while "a" ran
    await asyncio.gather(*late, third)

  batcher.start()
  try:
    asyncio.run(scenario())
  finally:
    batcher.stop()
  assert embedder.calls == [[["alone"]], [["a"]], [["b"], ["c"], ["d"]]]
