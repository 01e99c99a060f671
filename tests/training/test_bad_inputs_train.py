"""The trainer refuses what would fail late or leave state a rerun trusts, in one line, before writing anything
(issue: "nothing trusted unchecked, nothing written before it is checked")."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import launch_util
import tiny
from elmo_jax.data import Vocab
from elmo_jax.training import checkpoint, preflight
from elmo_jax.training.config import config_file_error
from paths import REPO_ROOT

PYTHON = sys.executable


def _corpus(tmp_path, name="train.txt", n=40):
  path = tmp_path / name
  path.write_text("".join(f"the cat {i % 7} sat on mat {i % 5} .\n" for i in range(n)))
  return str(path)


def _read_only_dir(tmp_path) -> str:
  if os.geteuid() == 0:  # root writes through any mode bits; sysfs refuses even root
    return "/sys/elmo_jax_test"
  ro = tmp_path / "ro"
  ro.mkdir()
  ro.chmod(0o555)
  return str(ro / "run")


@pytest.mark.parametrize("case, words", [
    ("dtype", "config.dtype='bf16': must be one of 'float32', 'bfloat16'"),
    ("shard", "config.data.shard='rowz': must be one of 'sentences', 'rows'"),
    ("optimizer", "config.optimizer='sgd': must be one of"),
    ("projection_dim", "config.options: lstm.projection_dim must be an integer >= 1, got 0"),
    ("learning_rate", "config.learning_rate=0.0: must be > 0"),
    ("dropout", "config.dropout=1.0: must be in [0, 1)"),
    ("hdf5_corpus", "train.hdf5 is an HDF5 file, not text"),
    ("nul_corpus", "holds NUL bytes"),
    ("long_blank_corpus", "blank.txt is empty (no non-blank line)"),
    ("read_only_workdir", "is not writable"),
    ("init_from", "no/such/run: no such file or folder"),
    ("init_from_text", "init_from=TMP/train.txt is a text file; expected a run's workdir"),
    ("init_from_empty_dir", "is a folder with no checkpoints, options.json or *.hdf5"),
    ("grad_clip", "config.grad_clip=0.0: must be > 0"),
    ("accumulator", "config.adagrad_initial_accumulator=-1.0: must be > 0"),
    ("dropout_none", "config.dropout=None: must be a number, not NoneType"),
    ("negatives_str", "config.n_negative_samples='8': must be an integer, not str"),
    ("eval_dir_alone", "config.data.prepared_eval_dir is set without config.data.prepared_dir"),
    ("empty_workdir", "--workdir is empty; give a path"),
    ("long_workdir", "is longer than this file system allows"),
    ("symlink_loop", "loop.txt: a symbolic link to no file (broken, or a loop of links)"),
    ("bom_vocab", "bom.txt:1: starts with a UTF-8 byte order mark"),
    ("typo_key", "config.learning_rat is not a setting of the trainer (a typo in the config file?); did you "
                 "mean config.learning_rate?"),
    ("non_utf8_workdir", "--workdir=TMP/run\\xff: the name holds bytes that are not UTF-8; rename it"),
    ("non_utf8_train_file", "config.data.train_files=TMP/tr\\xff.txt: the name holds bytes that are not UTF-8"),
])
def test_refused_in_one_line_before_anything_is_written(tmp_path, case, words):
  overrides = {"dtype": {"dtype": "bf16"}, "shard": {"data.shard": "rowz"}, "optimizer": {"optimizer": "sgd"},
               "projection_dim": {"options.lstm.projection_dim": 0}, "learning_rate": {"learning_rate": 0.0},
               "dropout": {"dropout": 1.0}, "init_from": {"init_from": "no/such/run"}}.get(case, {})
  train, workdir = _corpus(tmp_path), str(tmp_path / "run")
  if case == "hdf5_corpus":
    train = str(tmp_path / "train.hdf5")
    with h5py.File(train, "w") as f:
      f.create_dataset("x", data=np.arange(20_000))  # most of its bytes decode as "lines"
  elif case == "nul_corpus":
    (tmp_path / "nul.txt").write_bytes(b"the cat\x00\x00 sat\n" * 10)
    train = str(tmp_path / "nul.txt")
  elif case == "long_blank_corpus":  # past the first MiB, where the old check stopped reading
    (tmp_path / "blank.txt").write_text("\n" * 2_200_000)
    train = str(tmp_path / "blank.txt")
  elif case == "read_only_workdir":
    workdir = _read_only_dir(tmp_path)
  if case == "init_from_text":
    overrides = {"init_from": train}
  elif case == "init_from_empty_dir":
    (tmp_path / "empty").mkdir()
    overrides = {"init_from": str(tmp_path / "empty")}
  elif case == "grad_clip":
    overrides = {"grad_clip": 0.0}
  elif case == "accumulator":
    overrides = {"adagrad_initial_accumulator": -1.0}
  elif case == "eval_dir_alone":
    overrides = {"data.prepared_eval_dir": str(tmp_path)}
  elif case == "symlink_loop":
    os.symlink(tmp_path / "loop2.txt", tmp_path / "loop.txt")
    os.symlink(tmp_path / "loop.txt", tmp_path / "loop2.txt")
    train = str(tmp_path / "loop.txt")
  elif case == "bom_vocab":
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf<S>\n</S>\n<UNK>\nthe\n")
    overrides = {"data.vocab_file": str(tmp_path / "bom.txt")}
  elif case == "empty_workdir":
    workdir = ""
  elif case == "long_workdir":
    workdir = str(tmp_path / ("x" * 300) / "run")
  elif case == "non_utf8_workdir":  # issue 34: a UnicodeEncodeError traceback once the workdir and prepared/ existed
    workdir = os.path.join(str(tmp_path), os.fsdecode(b"run\xff"))
  elif case == "non_utf8_train_file":  # the same, from TensorBoard's hparams, once the whole run folder existed
    train = _corpus(tmp_path, os.fsdecode(b"tr\xff.txt"))
  config = tiny.train_config(train, **overrides)
  if case == "dropout_none":  # a config file may set any type: `c.dropout = None`
    config.dropout = None
  elif case == "negatives_str":
    del config["n_negative_samples"]
    config.n_negative_samples = "8"
  elif case == "typo_key":  # `c.learning_rat = 0.5` in a config file adds a key nothing reads
    config.learning_rat = 0.5
  words = words.replace("TMP", str(tmp_path))
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(preflight.PreflightError, match=_escape(words)) as e:
    preflight.check(config, workdir)
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(tmp_path)) == before


def _escape(text: str) -> str:
  import re
  return re.escape(text)


def test_every_shipped_config_passes_the_value_checks():
  import glob
  import importlib.util
  for path in sorted(glob.glob(os.path.join(REPO_ROOT, "configs", "*.py"))):
    spec = importlib.util.spec_from_file_location("_cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    if os.path.basename(path) == "finetune.py":  # its shape comes from init_from: here the TF-Hub fixture's
      from elmo_jax.training import variant  # pylint: disable=g-import-not-at-top
      from paths import TFHUB_MODULE  # pylint: disable=g-import-not-at-top
      config.init_from = TFHUB_MODULE
      config = variant.resolve(config, "/nonexistent-workdir")
    preflight.check_values(config)


def test_a_prepared_corpus_for_another_char_width_is_refused_and_unused_settings_are_named(tmp_path, capsys,
                                                                                          monkeypatch):
  from elmo_jax.data.prepare import prepare
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  prepare(str(tmp_path / "prep"), [_corpus(tmp_path)], pretokenized=True, vocab_max_size=50,
          log_line=lambda _: None)
  config = tiny.train_config("", **{"data.prepared_dir": str(tmp_path / "prep"), "data.vocab_max_size": 200})
  preflight.check(config, str(tmp_path / "run"))
  assert "was prepared with vocab_max_size=50 (config.data.vocab_max_size=200)" in capsys.readouterr().err
  wider = tiny.train_config("", **{"data.prepared_dir": str(tmp_path / "prep"),
                                   "options.char_cnn.max_characters_per_token": 60})
  with pytest.raises(preflight.PreflightError, match="holds char ids of 50 characters per token"):
    preflight.check(wider, str(tmp_path / "run"))


def test_a_training_file_edited_since_the_checkpoint_is_refused(tmp_path):
  from elmo_jax.training import input as input_lib
  config, workdir = _saved_run(tmp_path)
  meta_dir = workdir / "checkpoints" / "40" / "meta"
  meta_dir.mkdir(parents=True)
  (meta_dir / "metadata").write_text(json.dumps({
      "config": config.to_dict(), "vocab_sha256": Vocab.load(str(workdir / "vocab.txt")).sha256(), "data": [{}],
      "train_source": input_lib.train_source(config.data)}))
  preflight.check_run(config, str(workdir), 1, 1)
  os.utime(config.data.train_files)  # touched, unchanged: still resumes
  preflight.check_run(config, str(workdir), 1, 1)
  with open(config.data.train_files, "a") as f:
    f.write("a new sentence .\n")
  with pytest.raises(preflight.PreflightError, match=r"train.txt changed since \(.* bytes then, .* now\) "
                     r"\(checkpoint step 40"):
    preflight.check_run(config, str(workdir), 1, 1)


def test_a_config_file_typo_is_one_line_with_a_suggestion():
  default = os.path.join(REPO_ROOT, "configs", "default.py")
  message = config_file_error(["train.py", f"--config={REPO_ROOT}/configs/defualt.py"], default)
  assert message.startswith(f"--config={REPO_ROOT}/configs/defualt.py: no such config file; did you mean ")
  assert message.endswith("configs/default.py?")
  assert config_file_error(["train.py", f"--config={default}"], default) is None


def _saved_run(tmp_path, **overrides):
  """A workdir as a run that stopped after writing its vocabulary and config.json (no checkpoint)."""
  config = tiny.train_config(_corpus(tmp_path), **overrides)
  workdir = tmp_path / "run"
  workdir.mkdir()
  Vocab.build([s.split() for s in open(config.data.train_files)], max_size=overrides.get(
      "data.vocab_max_size", 100_000)).save(str(workdir))
  (workdir / "config.json").write_text(json.dumps(config.to_dict()))
  return config, workdir


def _fake_checkpoint(workdir, config, step=40):
  """The meta item of an Orbax step folder (`<step>/meta/metadata`, JSON), as the trainer writes it."""
  meta_dir = workdir / "checkpoints" / str(step) / "meta"
  meta_dir.mkdir(parents=True)
  vocab = Vocab.load(str(workdir / "vocab.txt"))
  (meta_dir / "metadata").write_text(json.dumps({"config": config.to_dict(), "vocab_sha256": vocab.sha256(),
                                                 "data": [{}]}))


@pytest.mark.parametrize("key, value, words", [
    ("batch_size", 16, "config.batch_size is 16 but the checkpoint was trained with 4"),
    ("data.train_files", "OTHER", "config.data.train_files is"),
])
def test_a_checkpoint_of_another_config_is_refused_before_the_run_writes(tmp_path, key, value, words):
  config, workdir = _saved_run(tmp_path)
  _fake_checkpoint(workdir, config)
  preflight.check_run(config, str(workdir), 1, 1)  # its own config resumes
  if value == "OTHER":
    value = _corpus(tmp_path, "other.txt", n=60)
  changed = tiny.train_config(config.data.train_files, **{key: value})
  with pytest.raises(preflight.PreflightError, match=_escape(words)) as e:
    preflight.check_run(changed, str(workdir), 1, 1)
  assert "checkpoint step 40" in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(preflight.PreflightError, match="written by 1 process"):
    preflight.check_run(config, str(workdir), 1, 2)


def test_init_from_of_another_model_shape_is_refused_before_the_run_writes(tmp_path):
  config, workdir = _saved_run(tmp_path)
  _fake_checkpoint(workdir, config)
  other = tiny.train_config(config.data.train_files, **{"init_from": str(workdir)})
  preflight.check(other, str(tmp_path / "new"))  # the same shape: accepted
  wider = tiny.train_config(config.data.train_files, **{"init_from": str(workdir), "options.lstm.dim": 64})
  with pytest.raises(preflight.PreflightError, match="model shape differs from config.options: lstm.dim is 32 "
                     "there, 64 here"):
    preflight.check(wider, str(tmp_path / "new"))
  elmo_files = tiny.train_config(config.data.train_files, **{"init_from": os.path.join(
      REPO_ROOT, "tests", "fixtures", "bilm_tf", "lm_weights.hdf5")})  # bilm-tf's fixture model: another shape
  with pytest.raises(preflight.PreflightError, match="model shape differs"):
    preflight.check(elmo_files, str(tmp_path / "new"))
  assert not (tmp_path / "new").exists()


def test_newest_meta_skips_an_unreadable_step(tmp_path):
  config, workdir = _saved_run(tmp_path)
  _fake_checkpoint(workdir, config, step=20)
  (workdir / "checkpoints" / "40" / "meta").mkdir(parents=True)
  (workdir / "checkpoints" / "40" / "meta" / "metadata").write_text("{torn")
  step, meta = checkpoint.newest_meta(str(workdir / "checkpoints"))
  assert step == 20 and meta["config"]["batch_size"] == 4
  assert checkpoint.newest_meta(str(tmp_path / "nothing")) is None


# --- the command, end to end (subprocesses) ----------------------------------------------------------------

def _train(cwd, *args, timeout=300):
  return subprocess.run([PYTHON, os.path.join(REPO_ROOT, "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO_ROOT})


def _one_line_error(proc, words):
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert lines[-1].startswith("train: error: ") and words in lines[-1], proc.stderr


@pytest.mark.slow
def test_train_py_refuses_mistakes_without_creating_the_workdir(tmp_path):
  _corpus(tmp_path)
  base = ["--workdir=run", "--config.data.train_files=train.txt", "--config.data.eval_files="]
  for args, words in [
      (["--config.optimizer=sgd", "--config.data.vocab_max_size=500"], "config.optimizer='sgd'"),
      (["--config.options.lstm.projection_dim=0"], "lstm.projection_dim must be an integer >= 1"),
      (["--config.dtype=bf16"], "config.dtype='bf16'"),
      (["--config.data.shard=rowz"], "config.data.shard='rowz'"),
  ]:
    _one_line_error(_train(tmp_path, *base, *args), words)
    assert not (tmp_path / "run").exists(), args
  proc = _train(tmp_path, "--workdir=run", f"--config={REPO_ROOT}/configs/trail.py")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
  assert proc.stderr.strip().startswith(f"FATAL Flags parsing error: --config={REPO_ROOT}/configs/trail.py: no such "
                                       f"config file; did you mean {REPO_ROOT}/configs/"), proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_a_refused_resume_leaves_the_workdir_as_it_was(tmp_path):
  """Resuming with another batch size or corpus is refused before config.json, vocab.txt or prepared/ change."""
  train = _corpus(tmp_path, n=200)
  _corpus(tmp_path, "other.txt", n=300)
  config = tiny.write_train_config(str(tmp_path / "tiny.py"), train, "", **{"num_train_steps": 2,
                                   "checkpoint_every_steps": 2, "eval_every_steps": 2, "log_every_steps": 1})
  args = ["--workdir=run", f"--config={config}"]
  proc = _train(tmp_path, *args)
  assert proc.returncode == 0, proc.stderr
  run = tmp_path / "run"
  snapshot = lambda: ({p: (run / p).read_bytes() for p in ("config.json", "vocab.txt")},
                      sorted(os.listdir(run / "prepared")))
  before = snapshot()
  for extra, words in [("--config.batch_size=16", "config.batch_size is 16 but the checkpoint was trained with 4"),
                       ("--config.data.train_files=other.txt", "config.data.train_files is 'other.txt'")]:
    _one_line_error(_train(tmp_path, *args, extra), words)
    assert snapshot() == before, extra
  text = open(train).read()
  with open(train, "w") as f:  # the corpus edited in place, at the same size: refused before it is prepared again
    f.write(text.replace("the", "The", 1))
  _one_line_error(_train(tmp_path, *args), "train.txt changed since (the same")
  assert snapshot() == before
  with open(train, "a") as f:
    f.write("a brand new sentence .\n")
  _one_line_error(_train(tmp_path, *args), "train.txt changed since")
  assert snapshot() == before
  assert "__pycache__" not in os.listdir(tmp_path)  # the config file was read, nothing written beside it


@pytest.mark.slow
def test_ctrl_c_while_preparing_the_corpus_is_one_line(tmp_path):
  (tmp_path / "big.txt").write_text("".join(f"w{i % 997} w{i % 13} the cat sat on a mat {i} .\n"
                                            for i in range(400_000)))
  proc = launch_util.popen_interruptible(
      [PYTHON, os.path.join(REPO_ROOT, "train.py"), "--workdir=run", "--config.data.train_files=big.txt",
       "--config.data.eval_files=", "--config.data.pretokenized", "--config.num_train_steps=2"],
      cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO_ROOT})
  seen = []
  while not (seen and seen[-1].startswith("preparing the training text")):  # past the preflight, tokenizing
    seen.append(proc.stdout.readline())
    assert seen[-1] and len(seen) < 20, (seen, proc.stderr.read() if not seen[-1] else "")
  time.sleep(0.5)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, (out, err)
  assert "Traceback" not in err and err.strip().splitlines()[-1] == \
      "train: interrupted; rerunning the same command resumes", err


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_with_one_line():
  code = ("import os, signal, sys, time; sys.path.insert(0, %r)\n"
          "from elmo_jax.runtime.distributed import StopRequest\n"
          "stop = StopRequest()\n"
          "os.kill(os.getpid(), signal.SIGINT)\n"
          "assert stop.signal_name == 'SIGINT'\n"
          "print('saving', flush=True)\n"
          "os.kill(os.getpid(), signal.SIGINT)\n"
          "time.sleep(30)\n" % REPO_ROOT)
  started = time.time()
  proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 130 and proc.stdout == "saving\n", proc
  assert proc.stderr.strip().startswith("train: second interrupt: stopped without finishing the save"), proc.stderr
  assert time.time() - started < 25
