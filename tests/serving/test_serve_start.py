"""`elmo-jax serve`'s start: flags out of range are one line before any load, a port another server listens
on is one line before the load (the first server listens from its bind on), a --layer the model lacks is one
line at load, and Ctrl-C during the first load is one line, exit 130."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import types

import pytest

pytest.importorskip("uvicorn")  # the serve extra (requirements-test.txt installs it)

import fixture_models  # noqa: E402
import launch_util  # noqa: E402
from paths import REPO_ROOT  # noqa: E402


def _serve(*flags: str, **kw) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "elmo_jax", "serve", *flags], cwd=REPO_ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=launch_util.env(1), **kw)


def _error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("W", "I"))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return fixture_models.write_fixture_folder(tmp_path_factory.mktemp("model"))


def test_max_wait_ms_is_bounded_before_anything_loads():
  proc = _serve("--model=nowhere", "--max_wait_ms=1e13")
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 1 and "--max_wait_ms must be in [0, 10000]" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_a_port_another_server_listens_on_is_one_line_before_the_load(model_dir):
  first = _serve(f"--model={model_dir}", "--port=0")
  try:
    port = None
    deadline = time.time() + 120
    while port is None:  # the first server listens from its bind on, while it loads
      assert first.poll() is None and time.time() < deadline
      port = _listening_port(first.pid)
      time.sleep(0.1)
    second = _serve(f"--model={model_dir}", f"--port={port}")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 1 and "cannot bind" in err and "Traceback" not in err, err
    assert len(_error_lines(err)) == 1, err
  finally:
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)


def _listening_port(pid: int) -> int | None:
  """The TCP port process `pid` listens on (from /proc), else None."""
  import os  # pylint: disable=g-import-not-at-top
  inodes = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
      target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
      continue
    if target.startswith("socket:["):
      inodes.add(target[8:-1])
  with open("/proc/net/tcp") as f:
    for line in f.readlines()[1:]:
      parts = line.split()
      if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
        return int(parts[1].split(":")[1], 16)
  return None


@pytest.mark.slow
def test_a_layer_the_model_lacks_is_one_line_at_load(model_dir):
  proc = _serve(f"--model={model_dir}", "--port=0", "--layer=5", "--batch_size=2")
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 1 and "--layer=5: the model has 3 layers" in err and "Traceback" not in err, err


@pytest.mark.slow
def test_ctrl_c_during_the_first_load_is_one_line_and_exit_130(model_dir, tmp_path):
  env = launch_util.env(1)
  # uncached: the load compiles (JAX's compilation cache too, which the suite points at its own folder)
  env["ELMO_JAX_CACHE"] = env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "cache")
  proc = subprocess.Popen([sys.executable, "-m", "elmo_jax", "serve", f"--model={model_dir}", "--port=0"],
                          cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
  time.sleep(6)  # into the load
  proc.send_signal(signal.SIGINT)
  try:
    _, err = proc.communicate(timeout=120)
  except subprocess.TimeoutExpired:
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"still running 120 s after Ctrl-C; it said: {err[-3000:]}") from None
  assert proc.returncode == 130 and "interrupted (Ctrl-C)" in err and "Traceback" not in err, err[-3000:]


def test_the_bound_socket_listens_at_once(monkeypatch):
  """`serve._bind` listens as it binds: a second bind of the port fails even with SO_REUSEADDR."""
  from elmo_jax.cli import serve  # pylint: disable=g-import-not-at-top
  # the flags it reads, without defining the command's flags in this process (another command's may be)
  monkeypatch.setattr(serve, "FLAGS", types.SimpleNamespace(host="127.0.0.1", port=0))
  sock = serve._bind()  # pylint: disable=protected-access
  try:
    port = sock.getsockname()[1]
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with pytest.raises(OSError):
      other.bind(("127.0.0.1", port))
    other.close()
  finally:
    sock.close()
