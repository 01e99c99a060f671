"""Fault injection: kill -9 and resume (bit-exact), SIGTERM, corrupt/empty/partial checkpoints, init_from."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import launch_util
from elmo_jax.training import init_from, resume
from elmo_jax.training.checkpoint import Checkpointer, IncompatibleCheckpointError

STEPS, EVERY, LOG_EVERY = 20, 4, 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """An uninterrupted run (A) and one killed with SIGKILL, resumed, stopped by SIGTERM, resumed (B)."""
  root = str(tmp_path_factory.mktemp("ft"))
  train = launch_util.write_corpus(os.path.join(root, "train.txt"))
  config = launch_util.write_config(os.path.join(root, "tiny.py"), train, num_train_steps=STEPS,
                           checkpoint_every_steps=EVERY, log_every_steps=LOG_EVERY, keep_checkpoints=2)
  a, b = os.path.join(root, "a"), os.path.join(root, "b")
  log_a, log_b = os.path.join(root, "a.log"), os.path.join(root, "b.log")
  # 1. SIGKILL right after step 9 (logged; checkpoint 8 saved and checksummed): the run kills itself there
  # (tests/signal_train.py), so the point is the same on a fast or a loaded machine.
  run_b = launch_util.launch(b, config, log=log_b, signal_at="9:KILL")
  assert launch_util.wait([run_b]) == [-signal.SIGKILL], launch_util.read(log_b)[-3000:]
  assert os.path.exists(f"{b}/checkpoints/checksums/8.json")
  killed_at = launch_util.max_step(b)
  # A starts once B compiled the steps alone: it loads them from the compilation cache (launched together,
  # both would compile the same programs).
  run_a = launch_util.launch(a, config, log=log_a)
  # 2. Resume, then SIGTERM after step 13 (a step that is not a checkpoint step): the run finishes that
  # step, saves it and exits 0.
  run_b = launch_util.launch(b, config, log=log_b, signal_at="13:TERM")
  assert launch_util.wait([run_b]) == [0], launch_util.read(log_b)[-3000:]
  term_log = launch_util.read(log_b)
  # 3. Resume to the end.
  run_b = launch_util.launch(b, config, log=log_b)
  codes = launch_util.wait([run_a, run_b])
  assert codes == [0, 0], launch_util.read(log_a)[-3000:] + launch_util.read(log_b)[-3000:]
  return {"a": a, "b": b, "log_b": launch_util.read(log_b), "term_log": term_log, "killed_at": killed_at,
          "config": config, "root": root, "train": train}


@pytest.mark.slow
def test_kill9_resume_sigterm_is_bit_exact(runs):
  resumed = [int(s) for s in re.findall(r"resumed from step (\d+)", runs["log_b"])]
  assert resumed == [8, 13] and runs["killed_at"] == 9
  assert "dropped" in runs["log_b"]  # the step-9 record, written after checkpoint 8, was rewound
  assert "stopped by SIGTERM after step 13" in runs["term_log"] and "saved checkpoint" in runs["term_log"]
  a, b = launch_util.exported(runs["a"]), launch_util.exported(runs["b"])
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert launch_util.records(runs["a"]) == launch_util.records(runs["b"])  # bit-identical losses, every step once
  assert [r["step"] for r in launch_util.records(runs["b"])] == [3, 6, 9, 12, 15, 18, 20]


@pytest.mark.slow
def test_refuses_other_model_shape_or_vocab(runs):
  ckpt = Checkpointer(os.path.join(runs["a"], "checkpoints"), read_only=True)
  meta = ckpt.manager.restore(STEPS, args=init_from._composite(meta=None))["meta"]
  ckpt.manager.close()
  import ml_collections
  config = ml_collections.ConfigDict(meta["config"])
  options = dict(meta["config"]["options"])
  resume.check_compatible(meta, config, options, meta["vocab_sha256"], 1, "w")  # itself: fine
  wider = json.loads(json.dumps(options))
  wider["lstm"]["dim"] = 64
  with pytest.raises(IncompatibleCheckpointError, match=r"options\.lstm\.dim is 32 there, 64 here"):
    resume.check_compatible(meta, config, wider, meta["vocab_sha256"], 1, "w")
  with pytest.raises(IncompatibleCheckpointError, match="another vocabulary"):
    resume.check_compatible(meta, config, options, "0" * 64, 1, "w")
  with pytest.raises(IncompatibleCheckpointError, match="this run has 2"):
    resume.check_compatible(meta, config, options, meta["vocab_sha256"], 2, "w")


# --- bad checkpoints, on a small pytree -----------------------------------------------------------------
def _state(step):
  return {"w": jnp.arange(64, dtype=jnp.float32) + step, "step": jnp.asarray(step)}


def _saved(directory, steps=(1, 2, 3), keep=5):
  ckpt = Checkpointer(directory, keep=keep)
  for s in steps:
    ckpt.save(s, _state(s), {"step": s})
  ckpt.close()
  return Checkpointer(directory, keep=keep)


def _largest_file(step_dir):
  files = [os.path.join(r, n) for r, _, ns in os.walk(step_dir) for n in ns]
  return max(files, key=os.path.getsize)


def _restored_step(ckpt):
  step, state, meta = ckpt.restore(jax.eval_shape(lambda: _state(0)))
  assert meta == {"step": step} and float(state["w"][0]) == step
  return step


def test_flipped_byte_falls_back_and_quarantines(tmp_path, capsys):
  ckpt = _saved(str(tmp_path))
  victim = _largest_file(tmp_path / "3")
  data = bytearray(open(victim, "rb").read())
  data[len(data) // 2] ^= 0x01
  open(victim, "wb").write(bytes(data))
  assert _restored_step(ckpt) == 2
  out = capsys.readouterr().out
  assert "checkpoint step 3 is unusable" in out and "sha256" in out
  assert os.listdir(tmp_path / "bad")[0].startswith("3-") and not (tmp_path / "3").exists()
  # Garbage collection cannot drop the good steps for the bad one: it is no longer a step.
  ckpt.save(4, _state(4), {"step": 4})
  ckpt.close()
  assert Checkpointer(str(tmp_path)).all_steps() == [1, 2, 4]


def test_empty_and_truncated_latest_steps_fall_back(tmp_path, capsys):
  ckpt = _saved(str(tmp_path))
  with open(_largest_file(tmp_path / "3"), "r+b") as f:
    f.truncate(10)
  ckpt.manager.close()
  os.makedirs(tmp_path / "7")  # e.g. a save that crashed after creating the folder
  ckpt = Checkpointer(str(tmp_path))
  assert _restored_step(ckpt) == 2
  out = capsys.readouterr().out
  assert "step 7 is unusable" in out and "step 3 is unusable" in out
  assert sorted(n.split("-")[0] for n in os.listdir(tmp_path / "bad")) == ["3", "7"]


def test_unfinished_async_save_is_ignored_and_missing_checksum_warns(tmp_path, capsys):
  ckpt = _saved(str(tmp_path))
  ckpt.manager.close()
  shutil.copytree(tmp_path / "3", tmp_path / "4.orbax-checkpoint-tmp-1234")  # killed mid-save
  os.remove(tmp_path / "checksums" / "3.json")  # killed between commit and checksum
  ckpt = Checkpointer(str(tmp_path))
  assert _restored_step(ckpt) == 3
  assert "no checksum" in capsys.readouterr().out


def test_incompatible_checkpoint_is_refused_not_quarantined(tmp_path):
  ckpt = _saved(str(tmp_path))
  def refuse(meta):
    raise IncompatibleCheckpointError("w: options.lstm.dim is 32 there, 64 here")
  with pytest.raises(IncompatibleCheckpointError, match="lstm.dim"):
    ckpt.restore(jax.eval_shape(lambda: _state(0)), refuse)
  wrong_shape = {"w": jax.ShapeDtypeStruct((65,), jnp.float32), "step": jax.ShapeDtypeStruct((), jnp.int32)}
  with pytest.raises(IncompatibleCheckpointError, match="verifies but does not restore"):
    ckpt.restore(wrong_shape)
  assert ckpt.all_steps() == [1, 2, 3] and not (tmp_path / "bad").exists()


# --- init_from ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_init_from_checkpoint_and_elmo_hdf5(runs):
  a = launch_util.exported(runs["a"])
  options = json.load(open(os.path.join(runs["a"], "export", "options.json")))
  from elmo_jax.data import Vocab
  same = Vocab.load(os.path.join(runs["a"], "vocab.txt")).sha256()
  bilm, softmax, text = init_from.load(runs["a"], options, same)
  assert "with its softmax" in text
  np.testing.assert_array_equal(softmax["W"], a["softmax/W"])
  bilm, softmax, text = init_from.load(runs["a"], options, "other")
  assert softmax is None and "new softmax" in text
  np.testing.assert_array_equal(bilm["char_cnn"]["char_embed"], a["char_embed"])
  bilm, softmax, text = init_from.load(os.path.join(runs["a"], "export", "weights.hdf5"), options, same)
  assert softmax is not None and "ELMo weights" in text
  wider = json.loads(json.dumps(options))
  wider["lstm"]["projection_dim"] = 16
  for path in (runs["a"], os.path.join(runs["a"], "export", "options.json")):
    with pytest.raises(init_from.InitFromError, match=r"lstm\.projection_dim is 8 there, 16 here"):
      init_from.load(path, wider, same)


@pytest.mark.slow
def test_init_from_trains_on_a_new_corpus(runs, tmp_path):
  """End to end: another corpus (another vocabulary) from run A's exported ELMo files, 2 steps."""
  from elmo_jax.training.loop import train_and_evaluate
  corpus = launch_util.write_corpus(str(tmp_path / "new.txt"), 50, seed=1,
                                    words=launch_util.WORDS[:10] + ["zebra", "quilt"])
  ns = {}
  exec(open(runs["config"]).read(), ns)
  config = ns["get_config"]()
  config.data.train_files = corpus
  config.num_train_steps = 2
  config.init_from = os.path.join(runs["a"], "export", "options.json")
  record = train_and_evaluate(config, str(tmp_path / "w"))
  assert record["step"] == 2 and np.isfinite(record["train_loss"])
  exported = launch_util.exported(str(tmp_path / "w"))
  assert exported["softmax/W"].shape[0] != launch_util.exported(runs["a"])["softmax/W"].shape[0]
