"""Bad training inputs are refused in one line with nothing written; one trainer per workdir; where it runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elmo_jax.runtime import devices
from elmo_jax.training import lock as lock_lib
from elmo_jax.training import preflight
from elmo_jax.training.config import base_config
from paths import REPO_ROOT

PYTHON = sys.executable


def _config(tmp_path, **top):
  c = base_config()
  train = tmp_path / "train.txt"
  train.write_text("a b c\nd e f\n")
  c.data.train_files, c.data.eval_files = str(train), ""
  for k, v in top.items():
    setattr(c, k, v)
  return c


def test_preflight_accepts_a_good_config(tmp_path):
  preflight.check(_config(tmp_path), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case, words", [
    ("missing", "missing.txt: file not found"),
    ("empty", "empty.txt is empty"),
    ("blank_gz", "blank.txt.gz is empty"),
    ("glob", "matches no file"),
    ("workdir_file", "is a file, not a directory"),
    ("batch0", "config.batch_size=0"),
    ("steps0", "config.num_train_steps=0: nothing would be trained"),
    ("truncated_vocab", "vocab"),
])
def test_preflight_refuses_in_one_line(tmp_path, case, words):
  import gzip
  c, workdir = _config(tmp_path), tmp_path / "run"
  if case == "missing":
    c.data.train_files = str(tmp_path / "missing.txt")
  elif case == "empty":
    (tmp_path / "empty.txt").write_text("")
    c.data.train_files = str(tmp_path / "empty.txt")
  elif case == "blank_gz":
    with gzip.open(tmp_path / "blank.txt.gz", "wt") as f:
      f.write("\n  \n")
    c.data.train_files = str(tmp_path / "blank.txt.gz")
  elif case == "glob":
    c.data.train_files = str(tmp_path / "nothing-*.txt")
  elif case == "workdir_file":
    workdir.write_text("x")
  elif case == "batch0":
    c.batch_size = 0
  elif case == "steps0":
    c.num_train_steps = 0
  elif case == "truncated_vocab":  # a resume whose vocab.txt lost its tail (counts no longer match)
    workdir.mkdir()
    (workdir / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\ncat\n")
    (workdir / "vocab_counts.tsv").write_text("<S>\t0\n</S>\t0\n<UNK>\t0\nthe\t5\ncat\t4\ndog\t3\n")
    (workdir / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n")
    meta = workdir / "checkpoints" / "40" / "meta"  # the checkpoint that makes it a resume (its meta item)
    meta.mkdir(parents=True)
    (meta / "metadata").write_text("{}")
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(preflight.PreflightError, match=words) as e:
    preflight.check(c, str(workdir))
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(tmp_path)) == before


def test_workdir_lock_excludes_a_second_trainer_and_is_released(tmp_path):
  held = lock_lib.WorkdirLock.acquire(str(tmp_path / "run"), process_index=0)
  with pytest.raises(lock_lib.WorkdirLocked, match=f"in use by another trainer \\(pid {os.getpid()}"):
    lock_lib.WorkdirLock.acquire(str(tmp_path / "run"), process_index=0)
  assert lock_lib.WorkdirLock.acquire(str(tmp_path / "run"), process_index=1)  # only process 0 locks
  held.release()
  assert not (tmp_path / "run" / lock_lib.LOCK_FILE).exists()
  again = lock_lib.WorkdirLock.acquire(str(tmp_path / "run"), process_index=0)
  again.release()


def test_stale_lock_of_a_dead_trainer_is_taken_over(tmp_path):
  run = tmp_path / "run"
  code = ("import os, sys; sys.path.insert(0, %r)\n"
          "from elmo_jax.training.lock import WorkdirLock\n"
          "WorkdirLock.acquire(%r, process_index=0); os._exit(0)" % (REPO_ROOT, str(run)))
  subprocess.run([PYTHON, "-c", code], check=True, timeout=60)  # dies holding it (no release)
  assert (run / lock_lib.LOCK_FILE).exists()
  lock = lock_lib.WorkdirLock.acquire(str(run), process_index=0)
  assert f'"pid": {os.getpid()}' in (run / lock_lib.LOCK_FILE).read_text()
  lock.release()


def _train(tmp_path, *args):
  return subprocess.run([PYTHON, os.path.join(REPO_ROOT, "train.py"), *args], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO_ROOT})


@pytest.mark.slow
def test_train_py_refuses_bad_inputs_and_a_held_workdir_in_one_line(tmp_path):
  (tmp_path / "train.txt").write_text("a b c\n")
  (tmp_path / "empty.txt").write_text("")
  proc = _train(tmp_path, "--workdir=run", "--config.data.train_files=empty.txt")
  assert proc.returncode == 1 and proc.stderr.strip() == "train: error: config.data.train_files: empty.txt is " \
      "empty (no non-blank line)", proc.stderr
  assert not (tmp_path / "run").exists()
  held = lock_lib.WorkdirLock.acquire(str(tmp_path / "run"), process_index=0)
  try:
    proc = _train(tmp_path, "--workdir=run", "--config.data.train_files=train.txt",
                  "--config.data.eval_files=")
  finally:
    held.release()
  assert proc.returncode == 1, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("train: error: ") and "in use by another" in proc.stderr
  assert "Traceback" not in proc.stderr
  assert proc.stderr.splitlines()[0].startswith("backend cpu: ")  # the first line says where it runs
  assert os.listdir(tmp_path / "run") == []  # no config.json, vocab or metrics of the refused run


def test_machine_accelerator_and_the_cpu_warning(tmp_path, monkeypatch):
  for k in devices._TPU_ENV:  # pylint: disable=protected-access
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("PATH", str(tmp_path))
  import jax
  jax.devices()  # starting JAX sets TPU_SKIP_MDS_QUERY: no sign of a TPU
  assert devices.machine_accelerator() is None
  smi = tmp_path / "nvidia-smi"
  smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'\n")
  smi.chmod(0o755)
  assert devices.machine_accelerator() == "gpu"
  lines = []
  devices.announce(lines.append)
  assert lines[0].startswith("backend cpu: ") and "local" in lines[0]
  assert "WARNING" in lines[1] and 'pip install -e ".[cuda12]"' in lines[1]
  smi.write_text("#!/bin/sh\nexit 9\n")  # a broken driver is no usable GPU
  assert devices.machine_accelerator() is None
  monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
  lines.clear()
  devices.announce(lines.append)
  assert devices.machine_accelerator() == "tpu" and 'pip install -e ".[tpu]"' in lines[1]


def _events(directory):
  """Every Event of the TensorBoard files in `directory` (TFRecord framing), file by file in order."""
  import struct
  from tensorboardX.proto import event_pb2
  out = []
  for name in sorted(os.listdir(directory)):
    data, pos, events = open(os.path.join(directory, name), "rb").read(), 0, []
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      events.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
      pos += 12 + length + 4
    out.append(events)
  return out


def test_tensorboard_purges_steps_of_a_killed_run_and_holds_config_and_hparams(tmp_path):
  import time
  from elmo_jax.training.metrics import MetricWriter
  config = base_config().to_dict()
  writer = MetricWriter(str(tmp_path), purge_step=1, config=config)
  for step in range(1, 11):
    writer.write({"step": step, "train_loss": 1.0 / step})
  writer.close()
  time.sleep(1.1)  # event file names carry the second
  writer = MetricWriter(str(tmp_path), purge_step=6, config=config)  # resumed from the step-5 checkpoint
  writer.write({"step": 6, "train_loss": 0.5})
  writer.close()
  first, second = _events(tmp_path / "tensorboard")
  from tensorboardX.proto.event_pb2 import SessionLog
  starts = lambda events: [e.step for e in events if e.session_log.status == SessionLog.START]  # noqa: E731
  assert starts(second) == [6] and starts(first) == [1]  # TensorBoard drops the old events at steps >= 6
  tags = {v.tag: v for e in second for v in e.summary.value}
  assert "config/text_summary" in tags or "config" in tags
  text = (tags.get("config/text_summary") or tags["config"]).tensor.string_val[0].decode()
  assert '"batch_size": 128' in text or '"batch_size"' in text
  plugins = {v.metadata.plugin_data.plugin_name for e in second for v in e.summary.value}
  assert "hparams" in plugins


@pytest.mark.slow
def test_metrics_import_tensorboardx_without_torch(tmp_path):
  """tensorboardX imports torch whenever torch is installed (1.3-1.6 s of every train.py start, for torch
  tensors we never pass): the metrics writer's import leaves it out, its event files are still written, and
  torch still imports afterwards."""
  pytest.importorskip("torch")  # installed with the tests' reference packages
  code = ("import os, sys\nfrom elmo_jax.training.metrics import MetricWriter\n"
          "assert 'torch' not in sys.modules, 'torch was imported'\n"
          "w = MetricWriter(sys.argv[1], config={'a': 1}); w.write({'step': 1, 'train_loss': 0.5}); w.close()\n"
          "import torch; print(torch.zeros(2).shape[0], len(os.listdir(os.path.join(sys.argv[1], 'tensorboard'))))")
  done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 0 and done.stdout.split() == ["2", "1"], done.stderr[-2000:]


def test_package_declares_dependencies_extras_and_console_scripts(tmp_path, monkeypatch):
  import ast
  import importlib.util
  import tomllib
  project = tomllib.load(open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb"))["project"]
  assert project["requires-python"] == ">=3.11,<3.14"  # tests/runtime/test_stack.py: both locks in range
  names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in project["dependencies"]}
  pinned = {line.split("==")[0].lower() for line in open(os.path.join(REPO_ROOT, "requirements.txt"))
            if "==" in line}
  assert {"jax", "flax", "optax", "orbax-checkpoint", "grain", "h5py", "tensorboardx", "tqdm"} <= names <= pinned
  extras = project["optional-dependencies"]
  assert extras["cuda12"][0].startswith("jax[cuda12]") and extras["tpu"][0].startswith("jax[tpu]")
  assert {"notebook", "test", "serve"} <= set(extras)
  assert not {"uvicorn", "starlette"} & pinned  # the server's packages: the serve extra, never training's lock
  # the planner's compilers are extras, never dependencies (CI installs neither)
  assert extras["plan-tpu"][0].startswith("jax[tpu]") and extras["plan-gpu"][0].startswith("jax-cuda12-plugin")
  assert project["scripts"] == {"elmo-jax": "elmo_jax.cli:main"}  # one script: `elmo-jax <command>`
  for target in project["scripts"].values():
    # Read, not imported: the CLI modules define absl flags at import and share names (--task).
    module, func = target.split(":")
    source = open(importlib.util.find_spec(module).origin).read()
    assert any(isinstance(node, ast.FunctionDef) and node.name == func for node in ast.parse(source).body), target
  from elmo_jax import cli
  monkeypatch.chdir(tmp_path)  # a console script run elsewhere still finds the clone's configs
  assert cli.default_config() == os.path.join(REPO_ROOT, "configs", "default.py")


@pytest.mark.slow
def test_a_held_workdir_stops_every_process_of_a_multi_process_run(tmp_path):
  import launch_util
  train = launch_util.write_corpus(str(tmp_path / "train.txt"))
  config = launch_util.write_config(str(tmp_path / "tiny.py"), train, num_train_steps=4)
  run = str(tmp_path / "run")
  held = lock_lib.WorkdirLock.acquire(run, process_index=0)
  try:
    port = launch_util.free_port()
    procs = [launch_util.launch(run, config, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                       f"--process_id={i}", log=str(tmp_path / f"p{i}.log"), devices=1) for i in range(2)]
    codes = launch_util.wait(procs, timeout=120)
  finally:
    held.release()
  logs = [launch_util.read(str(tmp_path / f"p{i}.log")) for i in range(2)]
  assert codes == [1, 1], logs
  assert "in use by another trainer" in logs[0] and "process 0 could not lock the workdir" in logs[1], logs
  assert all("Traceback" not in log for log in logs), logs
  assert os.listdir(run) == []


def test_batch_that_does_not_split_over_the_devices(tmp_path):
  c = base_config()
  c.batch_size = 12
  preflight.check_run(c, str(tmp_path), 4, 1)
  with pytest.raises(preflight.PreflightError, match=r"batch_size=12 must be divisible by the 8 devices "
                     r"\(e.g. --config.batch_size=16\)"):
    preflight.check_run(c, str(tmp_path), 8, 1)
