"""What a serving user expects of TEI and Triton: an API key off loopback (401 without it, the health routes
open), where each answer's time went (headers), queue / inference / padding histograms in `/metrics`, and batches
gathered by tokens, not by a sentence count (the Embedder packs sentences into rows)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

pytest.importorskip("uvicorn")  # the serve extra (requirements-test.txt installs it)

from elmo_jax.cli.serve import is_loopback  # noqa: E402
from elmo_jax.serving.app import Service  # noqa: E402
from elmo_jax.serving.batcher import Batcher  # noqa: E402
from serve_util import FakeEmbedder, ThreadServer, call, infer_json, one_line_error  # noqa: E402

INFER = "/v2/models/elmo/infer"
KEY = "k3y-with-some-length"


class PackingFake(FakeEmbedder):
  """A FakeEmbedder that counts row-steps as the packing Embedder does: 8 rows of its longest sentence + 2."""

  def __init__(self):
    super().__init__()
    self.row_steps = [0, 0]

  def embed_sentences(self, sentences):
    self.row_steps[0] += 8 * (max(map(len, sentences)) + 2)
    self.row_steps[1] += sum(len(s) + 2 for s in sentences)
    return super().embed_sentences(sentences)


@pytest.fixture(scope="module")
def keyed():
  with ThreadServer(Service(PackingFake(), access_log=False, api_key=KEY)) as s:
    yield s


@pytest.mark.parametrize("path,method", [(INFER, "POST"), ("/v1/embeddings", "POST"), ("/v2/models/elmo", "GET"),
                                         ("/metrics", "GET"), ("/v2", "GET"), ("/v1/models", "GET")])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Bearer {KEY}x", KEY, f"bearer {KEY}"])
def test_without_the_key_every_route_but_health_is_401(keyed, path, method, auth):
  status, head, body = call(keyed.port, method, path, infer_json(["the cat"]) if method == "POST" else None,
                            {"Authorization": auth} if auth else {})
  assert status == 401 and head["www-authenticate"].startswith("Bearer"), (status, body)
  assert "Authorization: Bearer KEY" in one_line_error(body)


def test_with_the_key_it_answers_and_health_needs_none(keyed):
  for path in ("/v2/health/live", "/v2/health/ready"):
    assert call(keyed.port, "GET", path)[0] == 200
  status, _, body = call(keyed.port, "POST", INFER, infer_json(["the cat sat"]), {"Authorization": f"Bearer {KEY}"})
  assert status == 200 and json.loads(body)["outputs"][0]["name"] == "sentence_vector"
  status, _, body = call(keyed.port, "POST", "/v1/embeddings", {"model": "elmo", "input": "a b"},
                         {"Authorization": f"Bearer {KEY}"})
  assert status == 200 and len(json.loads(body)["data"][0]["embedding"]) == 4


def test_answers_say_where_their_time_went_and_metrics_hold_the_histograms(keyed):
  auth = {"Authorization": f"Bearer {KEY}"}
  for path, body in ((INFER, infer_json(["the cat sat", "a"])), ("/v1/embeddings", {"model": "elmo", "input": "x"})):
    status, head, _ = call(keyed.port, "POST", path, body, auth)
    assert status == 200
    queue, inference, total = (float(head[f"x-{k}-time"]) for k in ("queue", "inference", "total"))
    assert 0 <= queue and 0 <= inference and queue + inference <= total + 1.0  # ms; the total is taken last
  status, head, _ = call(keyed.port, "GET", "/v2/models/elmo", None, auth)
  assert status == 200 and "x-total-time" in head and "x-queue-time" not in head  # no batch behind it
  text = call(keyed.port, "GET", "/metrics", None, auth)[2].decode()
  for name in ("elmo_queue_seconds", "elmo_inference_seconds", "elmo_batch_padding_ratio"):
    count = float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"{name}_count")))
    assert count >= 2, name
  padding = [line for line in text.splitlines() if line.startswith("elmo_batch_padding_ratio_sum")]
  assert 0 < float(padding[0].split()[-1])  # 8 rows of the longest: the fake's batches waste steps


def test_is_loopback():
  assert all(map(is_loopback, ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"]))
  assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.1", "example.org", "192.168.1.2"]))


def test_a_batch_gathers_by_tokens_past_the_rows_of_one_shape():
  """200 one-token requests queued while a batch runs go into the next batch together: more sentences than the
  warm shapes' 64 rows (the Embedder packs them), within `max_batch_tokens`."""
  embedder = FakeEmbedder()
  batcher = Batcher(embedder, max_batch_tokens=150, max_wait_ms=50)
  batcher.start()

  async def run():
    embedder.release.clear()
    first = batcher.submit([["first"]])
    await asyncio.sleep(0.05)  # the batch thread is inside the first call now
    rest = [batcher.submit([[f"w{i}"]]) for i in range(200)]
    embedder.release.set()
    return await asyncio.gather(first, *rest)

  try:
    answers = asyncio.run(run())
  finally:
    batcher.stop()
  assert [len(c) for c in embedder.calls] == [1, 150, 50]
  assert all(np.array_equal(a[0], FakeEmbedder.layers([f"w{i}"])) for i, a in enumerate(answers[1:]))
