"""A request's cost is known and bounded before any work, and slow clients are timed out: every input dimension
checked (a zero beside a huge one included), tokens and the answer's bytes within limits derived from the
server's flags (413 naming the limit), malformed parts 400, `--tokenize` the same on both endpoints, a body that
never arrives 408, a connection that never sends its headers closed; a fuzz test over shapes, datatypes and
outputs gets 4xx (never 5xx) with the server's memory flat and health answered throughout."""
from __future__ import annotations

import json
import re
import resource
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("uvicorn")  # the serve extra (requirements-test.txt installs it)

from elmo_jax.serving import v2  # noqa: E402
from elmo_jax.serving.app import Service  # noqa: E402
from serve_util import FakeEmbedder, ThreadServer, call, infer_json, one_line_error  # noqa: E402

INFER = "/v2/models/elmo/infer"


class WideEmbedder(FakeEmbedder):
  """Says 2P = 1024 (the original model's) so an answer's size is a real model's; it embeds nothing here:
  every request below is refused before any work, or asks for lengths only."""
  output_dim = 1024


def _tokenize(text: str) -> list[str]:
  return re.findall(r"\w+|[^\w\s]", text)


@pytest.fixture(scope="module")
def server():
  embedder = WideEmbedder()
  with ThreadServer(Service(embedder, access_log=False, max_tokens=512, tokenize=_tokenize, timeout_s=2.0),
                    header_timeout_s=1.0) as s:
    s.embedder = embedder
    yield s


def _text(shape, data=None, parameters=None) -> dict:
  spec = {"name": "text", "datatype": "BYTES", "shape": shape, **({"data": data} if data is not None else {})}
  return {"inputs": [{**spec, **({"parameters": parameters} if parameters is not None else {})}]}


@pytest.mark.parametrize("body, status, words", [
    (_text([10**12, 0], []), 413, "1000000000000 sentences"),  # the product is 0: each dimension is checked
    (_text([0, 10**12], []), 413, "rows of 1000000000000 tokens"),
    (_text([0], []), 400, "holds no sentence"),
    ({"inputs": []}, 400, "a list of one input"),
    ({**_text([1], ["a"]), "parameters": [1]}, 400, "parameters must be a JSON object"),
    (_text([1], ["a"], parameters="x"), 400, "parameters must be a JSON object"),
    ({**_text([1], ["a"]), "outputs": [{"name": "top", "parameters": 3}]}, 400, "parameters must be a JSON object"),
    # one 512-token sentence and 1,500 one-token ones, layers as JSON: [1501, 3, 512, 1024] padded
    ({**_text([1501], [" ".join(["w"] * 512)] + ["x"] * 1500), "outputs": [{"name": "layers"}]}, 413,
     "this server writes at most 134,217,728"),
    (_text([4000], [" ".join(["w"] * 500)] * 4000), 413, "tokens; this server takes at most 65536"),
    (None, 400, "nested deeper"),
])
def test_each_dimension_is_checked_before_any_work(server, body, status, words):
  calls = len(server.embedder.calls)
  data = json.dumps(body).encode() if body else b"[" * 100 + b"]" * 100
  start = time.perf_counter()
  got, _, reply = call(server.port, "POST", INFER, data)
  assert (got, words in one_line_error(reply)) == (status, True), reply[:300]
  assert len(server.embedder.calls) == calls and time.perf_counter() - start < 5  # refused, nothing embedded


def test_tokenize_means_the_same_on_both_endpoints(server):
  text = "Hello, world! It's 3.5 km."
  calls = len(server.embedder.calls)
  assert call(server.port, "POST", INFER, {**_text([1], [text]), "outputs": [{"name": "lengths"}]})[0] == 200
  assert call(server.port, "POST", "/v1/embeddings", {"model": "elmo", "input": text,
                                                       "encoding_format": "base64"})[0] == 200
  v2_tokens, openai_tokens = (c[0] for c in server.embedder.calls[calls:calls + 2])
  assert v2_tokens == openai_tokens == _tokenize(text)


def test_limits_follow_the_flags():
  limits = v2.Limits.derived(8 << 20, 512, 4096, 3, 1024)
  assert (limits.max_sentences, limits.max_total_tokens, limits.max_answer_bytes) == (16384, 65536, 128 << 20)
  assert limits.answer_bytes([3, 5], {"layers": True, "lengths": False}) == 2 * 3 * 5 * 1024 * 4 + 2 * 25


def test_a_body_that_never_arrives_is_408_and_silent_headers_are_closed(server):
  with socket.create_connection(("127.0.0.1", server.port), timeout=10) as half:
    half.sendall(b"POST /v2/models/elmo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inputs\"")
    reply = half.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408") and b"--timeout_s" in reply, reply
  idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(20)]
  idle[0].sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")  # half its headers, then nothing
  start = time.perf_counter()
  for sock in idle:
    assert sock.recv(1) == b""  # closed by the server past header_timeout_s
    sock.close()
  assert time.perf_counter() - start < 8
  assert call(server.port, "GET", "/v2/health/live")[0] == 200


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_DIMS = st.one_of(st.integers(0, 3), st.integers(0, 10**13), st.just(-1), st.text(max_size=2), st.booleans())
_REQUESTS = st.fixed_dictionaries({
    "inputs": st.one_of(st.lists(st.fixed_dictionaries({
        "name": st.sampled_from(["text", "ids"]),
        "datatype": st.sampled_from(["BYTES", "FP32", "INT32", 7]),
        "shape": st.one_of(st.lists(_DIMS, max_size=3), st.integers()),
        "data": st.one_of(st.lists(st.text(alphabet="ab c", max_size=6), max_size=4),
                          st.lists(st.lists(st.text(alphabet="ab", max_size=3), max_size=3), max_size=3),
                          st.integers(), st.none()),
        "parameters": st.one_of(st.none(), st.integers(), st.fixed_dictionaries(
            {"binary_data_size": st.one_of(st.integers(-5, 10**12), st.text(max_size=2))})),
    }), max_size=2), st.integers(), st.none()),
    "outputs": st.one_of(st.none(), st.lists(st.fixed_dictionaries({
        "name": st.sampled_from([*v2.OUTPUTS, "other"]),
        "parameters": st.one_of(st.none(), st.booleans(), st.fixed_dictionaries({"binary_data": st.booleans()}))}),
        max_size=3)),
    "parameters": st.one_of(st.none(), st.lists(st.integers(), max_size=1),
                            st.fixed_dictionaries({"binary_data_output": st.booleans()})),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(request=_REQUESTS)
def test_fuzzed_requests_are_answered_or_refused_never_5xx_with_memory_flat(server, request):
  before = _rss_mb()
  status, _, reply = call(server.port, "POST", INFER, json.dumps(request).encode())
  assert status < 500, (request, reply[:300])
  if status != 200:
    one_line_error(reply)
  assert call(server.port, "GET", "/v2/health/ready")[0] == 200
  assert _rss_mb() - before < 200  # the whole fuzz stays within the answer limit's order, never gigabytes


def test_connections_are_capped_below_the_open_file_limit(monkeypatch):
  from elmo_jax.serving import server as server_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(resource, "getrlimit", lambda which: (128, 4096))
  assert server_lib.connection_limit() == 128 - server_lib.SPARE_FILES
  monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
  assert server_lib.connection_limit() == 1024


def test_sigterm_waits_drain_s_once_not_again_in_uvicorns_shutdown():
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  embedder = FakeEmbedder()
  s = ThreadServer(Service(embedder, access_log=False, timeout_s=60), drain_s=1.0, timeout_graceful_shutdown=30)
  with s:
    embedder.release.clear()  # a request that never finishes
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      stuck = pool.submit(call, s.port, "POST", INFER, infer_json(["a"]), None, 60)
      deadline = time.time() + 10
      while s.service.in_flight != 1:
        assert time.time() < deadline
        time.sleep(0.01)
      start = time.perf_counter()
      s.server.handle_exit(signal.SIGTERM, None)
      s.thread.join(20)
      assert not s.thread.is_alive() and time.perf_counter() - start < 4  # ~drain_s, not drain_s + 30
      embedder.release.set()
      stuck.exception(30)
