"""config.per_device_batch_size, the alternative to the global batch_size (issue 32, item 4): the global batch
it gives on 1, 2 and 8 devices, one-line refusals before anything is written, the planner and lm1b."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

import launch_util
import tiny
from elmo_jax.formats import options as options_lib
from elmo_jax.plan import targets as targets_lib
from elmo_jax.plan import train as plan_lib
from elmo_jax.training import checkpoint, preflight, resume
from elmo_jax.training.config import BatchSizeError, global_batch_size, with_global_batch
from paths import REPO_ROOT, TESTS_DIR


def _corpus(tmp_path) -> str:
  path = tmp_path / "train.txt"
  path.write_text("".join(f"the cat {i % 7} sat on mat {i % 5} .\n" for i in range(40)))
  return str(path)


@pytest.mark.parametrize("n_devices, rows", [(1, 128), (2, 256), (8, 1024)])
def test_per_device_batch_size_times_the_devices_is_the_global_batch(n_devices, rows):
  assert global_batch_size(0, 128, n_devices) == rows
  config = with_global_batch(tiny.train_config("unused.txt", batch_size=0, per_device_batch_size=128), n_devices)
  assert config.batch_size == rows and config.per_device_batch_size == 128  # how it was asked for, recorded
  assert global_batch_size(rows, 0, n_devices) == rows  # the global batch as before
  assert plan_lib.rows_per_device(tiny.train_config("unused.txt", batch_size=0, per_device_batch_size=128),
                                  n_devices) == 128


def test_lm1b_is_bilm_tf_128_rows_per_device_on_any_device_count():
  spec = importlib.util.spec_from_file_location("_lm1b", os.path.join(REPO_ROOT, "configs", "lm1b.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  assert (config.batch_size, config.per_device_batch_size) == (0, 128)
  assert with_global_batch(config, 3).batch_size == 384  # bilm-tf's 3 GPUs
  assert [plan_lib.rows_per_device(config, n) for n in (4, 8, 256)] == [128, 128, 128]
  assert plan_lib.rows_per_device(config, 256, per_device_batch=512) == 512  # the planner's flag wins


@pytest.mark.parametrize("batch, per_device, words", [
    (384, 128, "config.batch_size=384 and config.per_device_batch_size=128 are both set; set one of them"),
    (0, 0, "config.batch_size=0 and config.per_device_batch_size=0: set one of them"),
    (-4, 0, "config.batch_size=-4: must be >= 0"),
])
def test_both_or_neither_is_one_line_before_anything_is_written(tmp_path, batch, per_device, words):
  config = tiny.train_config(_corpus(tmp_path), batch_size=batch, per_device_batch_size=per_device)
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check(config, str(tmp_path / "run"))
  assert str(e.value).startswith(words) and "\n" not in str(e.value)
  assert sorted(os.listdir(tmp_path)) == before
  with pytest.raises(targets_lib.TargetError, match=words):  # the planner says it too
    plan_lib.rows_per_device(config, 2)


def test_the_trainer_in_process_refuses_both_before_writing(tmp_path):
  from elmo_jax.training.loop import train_and_evaluate
  config = tiny.train_config(_corpus(tmp_path), batch_size=8, per_device_batch_size=2)
  with pytest.raises(BatchSizeError, match="are both set"):
    train_and_evaluate(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_a_batch_that_does_not_divide_over_the_devices_names_both_numbers(tmp_path):
  config = tiny.train_config(_corpus(tmp_path), batch_size=6)
  preflight.check_run(config, str(tmp_path / "run"), 3, 1)
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check_run(config, str(tmp_path / "run"), 4, 1)
  assert str(e.value) == ("config.batch_size=6 must be divisible by the 4 devices (e.g. --config.batch_size=8); "
                          "or give rows per device: --config.per_device_batch_size=1 --config.batch_size=0")
  assert not os.path.exists(tmp_path / "run")
  with pytest.raises(targets_lib.TargetError, match="batch_size=6 must be divisible by the 4 devices"):
    plan_lib.rows_per_device(config, 4)


def test_a_resume_compares_the_global_batch_however_it_was_asked_for():
  per_device = tiny.train_config("unused.txt", batch_size=0, per_device_batch_size=2)
  saved = with_global_batch(per_device, 2)  # a run of 2 x 2 rows
  meta = {"config": saved.to_dict(), "vocab_sha256": "v", "data": [{}]}
  options = options_lib.validate(per_device.options.to_dict(), "config.options")
  resume.check_compatible(meta, with_global_batch(per_device, 2), options, "v", 1, "run")
  resume.check_compatible(meta, with_global_batch(tiny.train_config("unused.txt", batch_size=4), 2), options, "v",
                          1, "run")  # the same 4 rows as a global batch
  with pytest.raises(checkpoint.IncompatibleCheckpointError) as e:
    resume.check_compatible(meta, with_global_batch(per_device, 4), options, "v", 1, "run")
  assert ("config.batch_size is 8 (2 per device x 4 devices: config.per_device_batch_size) but the checkpoint "
          "was trained with 4") in str(e.value)


_EIGHT = textwrap.dedent(r"""
  import json, os, sys
  sys.path[:0] = sys.argv[1].split(os.pathsep)
  import jax, tiny
  from elmo_jax.training.loop import train_and_evaluate
  config = tiny.train_config(sys.argv[2], **{"batch_size": 0, "per_device_batch_size": 1, "num_train_steps": 2,
                                             "log_every_steps": 2, "checkpoint_every_steps": 2,
                                             "n_negative_samples": 0, "data.vocab_max_size": 50})
  train_and_evaluate(config, sys.argv[3])
  print(json.dumps({"devices": jax.device_count()}))
""")


@pytest.mark.slow  # a subprocess training on 8 simulated devices
def test_a_run_on_8_devices_trains_per_device_times_8_rows(tmp_path):
  script = tmp_path / "eight.py"
  script.write_text(_EIGHT)
  workdir = tmp_path / "run"
  env = {**os.environ, "XLA_FLAGS": launch_util.xla_flags(8), "JAX_PLATFORMS": "cpu",  # the tests' compile options
         "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  proc = subprocess.run([sys.executable, str(script), TESTS_DIR, _corpus(tmp_path), str(workdir)], env=env,
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"devices": 8}
  assert "training 2 steps of 8 (1 per device) x 5 tokens on 8 device(s)" in proc.stdout
  saved = json.loads((workdir / "config.json").read_text())
  assert (saved["batch_size"], saved["per_device_batch_size"]) == (8, 1)
  record = [json.loads(line) for line in open(workdir / "metrics.jsonl") if '"train_loss"' in line][-1]
  assert record["tokens_per_sec_per_device"] == pytest.approx(record["tokens_per_sec"] / 8)
