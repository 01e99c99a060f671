"""Domain fine-tuning (bilm-tf's restart on new text): `config.init_from` + `config.freeze_bilm_steps`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import h5py
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import launch_util as lu
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.training import freeze, init_from, loop, optimizer as optimizer_lib, resume
from elmo_jax.training.checkpoint import IncompatibleCheckpointError
from elmo_jax.training.config import base_config


# --- the optimizer ----------------------------------------------------------------------------------------
def _params_and_grads(n: int):
  rng = np.random.default_rng(0)
  params = {"bilm": {"lstm": {"w": jnp.ones((3, 2))}}, "softmax": {"W": jnp.ones((4, 2)), "b": jnp.zeros(4)}}
  grads = [jax.tree_util.tree_map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 3, jnp.float32), params)
           for _ in range(n)]
  return params, grads


@pytest.mark.parametrize("name", ["adam", "adagrad", "adamw"])
def test_frozen_bilm_optimizer(name):
  """While frozen: softmax = chain(clip, opt) on the softmax alone, biLM and its state untouched; then the
  biLM's first update is a fresh optimizer's first update (Adam's bias correction starts afresh)."""
  make = {"adam": lambda: optax.adam(0.1), "adagrad": lambda: optax.adagrad(0.1, initial_accumulator_value=1.0),
          "adamw": lambda: optax.adamw(0.1, weight_decay=0.1)}[name]
  clip = optax.clip_by_global_norm(1.0)
  tx = freeze.bilm_frozen_for(2, clip, make())
  params, grads = _params_and_grads(3)
  state = tx.init(params)
  state0 = state
  ref = optax.chain(clip, make())
  ref_state = ref.init(params["softmax"])
  for k in range(2):
    updates, state = tx.update(grads[k], state, params)
    ref_updates, ref_state = ref.update(grads[k]["softmax"], ref_state, params["softmax"])
    np.testing.assert_array_equal(updates["bilm"]["lstm"]["w"], np.zeros((3, 2)))
    jax.tree_util.tree_map(np.testing.assert_array_equal, state.split.inner_states["frozen"],
                           state0.split.inner_states["frozen"])
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates["softmax"],
                           ref_updates)
  updates, state = tx.update(grads[2], state, params)
  clipped, _ = clip.update(grads[2], clip.init(params))  # global norm over everything once unfrozen
  fresh = make()
  expected, _ = fresh.update(clipped["bilm"], fresh.init(params["bilm"]), params["bilm"])
  np.testing.assert_allclose(updates["bilm"]["lstm"]["w"], expected["lstm"]["w"], rtol=1e-6)
  assert np.abs(updates["bilm"]["lstm"]["w"]).min() > 0
  assert int(state.count) == 3


def test_make_optimizer_reads_freeze_bilm_steps():
  config = base_config()
  assert config.freeze_bilm_steps == 0
  assert not isinstance(optimizer_lib.make_optimizer(config).init({"bilm": {}, "softmax": {}}), freeze.FrozenBiLMState)
  config.freeze_bilm_steps = 5
  assert isinstance(optimizer_lib.make_optimizer(config).init({"bilm": {}, "softmax": {}}), freeze.FrozenBiLMState)
  config.freeze_bilm_steps = -1
  with pytest.raises(ValueError, match="freeze_bilm_steps must be >= 0"):
    optimizer_lib.make_optimizer(config)


def test_resume_refuses_another_freeze_bilm_steps():
  config = base_config()
  options = config.options.to_dict()
  saved = base_config()
  saved.freeze_bilm_steps = 200
  meta = {"config": saved.to_dict(), "vocab_sha256": "v", "data": [{}]}
  with pytest.raises(IncompatibleCheckpointError, match=r"config.freeze_bilm_steps is 0 .* with 200"):
    resume.check_compatible(meta, config, options, "v", 1, "w")


@pytest.mark.parametrize("freeze_steps, told", [(0, True), (50, False)])
def test_init_from_without_softmax_recommends_freezing(monkeypatch, capsys, tmp_path, freeze_steps, told):
  class NoCheckpoint:
    def restore(self, *args):
      return None
  monkeypatch.setattr(init_from, "apply", lambda *a: ("state", f"ELMo weights w.hdf5 ({init_from.NEW_SOFTMAX})"))
  config = ml_collections.ConfigDict({"init_from": "w.hdf5", "freeze_bilm_steps": freeze_steps})
  run = type("Run", (), {"local": str(tmp_path)})()  # no metrics.jsonl there: nothing to rewind
  state, _ = loop.restore_or_init(config, run, NoCheckpoint(), None, None, None, None, None,
                                  type("V", (), {"sha256": lambda self: "v"})(), None)
  assert state == "state"
  assert ("--config.freeze_bilm_steps=" in capsys.readouterr().out) == told


# --- end to end: train.py on 8 devices, softmax split over them ---------------------------------------
FREEZE, STEPS = 3, 6
# A starved CPU (the machine is shared) can take minutes to compile the 8-device step; the runs take seconds.


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """S: a source run on corpus A. F: S fine-tuned on corpus B (another vocabulary: new softmax) with the biLM
  frozen for 3 of 6 steps, saving every step. G: F's workdir cut back to step 2 (inside the frozen phase)
  and resumed. R: fine-tuned from released-format files of S (options.json + hdf5, no softmax)."""
  root = str(tmp_path_factory.mktemp("dft"))
  kw = dict(devices=8)
  a = lu.write_corpus(os.path.join(root, "a.txt"))
  b = lu.write_corpus(os.path.join(root, "b.txt"), 200, seed=1, words=lu.WORDS[:10] + ["zebra", "quilt"])
  config = lu.write_config(os.path.join(root, "tiny.py"), a, num_train_steps=4, checkpoint_every_steps=4,
                           log_every_steps=1, batch_size=8, shard_softmax=True, keep_checkpoints=10)
  s, f, g, r = (os.path.join(root, n) for n in "sfgr")
  logs = {n: os.path.join(root, n + ".log") for n in "sfgr"}
  assert lu.wait([lu.launch(s, config, log=logs["s"], **kw)], timeout=900) == [0], lu.read(logs["s"])[-3000:]
  ft = (f"--config.data.train_files={b}", f"--config.num_train_steps={STEPS}", "--config.checkpoint_every_steps=1")
  run_f = lu.launch(f, config, f"--config.init_from={s}", f"--config.freeze_bilm_steps={FREEZE}", *ft,
                    log=logs["f"], **kw)
  # Released-format files: options.json + hdf5 without a softmax.
  released = os.path.join(root, "released")
  os.makedirs(released)
  options = options_lib.load(os.path.join(s, "export", "options.json"))
  source = weights_lib.load_hdf5(os.path.join(s, "export", "weights.hdf5"), options)["params"]
  weights_lib.save_hdf5(os.path.join(released, "weights.hdf5"), source, options)
  options_lib.save(options, os.path.join(released, "options.json"))
  run_r = lu.launch(r, config, f"--config.init_from={released}/options.json", "--config.freeze_bilm_steps=2",
                    ft[0], "--config.num_train_steps=3", ft[2], log=logs["r"], **kw)
  assert lu.wait([run_f, run_r], timeout=900) == [0, 0], (lu.read(logs["f"])[-3000:]
                                                           + lu.read(logs["r"])[-3000:])
  shutil.copytree(f, g)
  for k in range(3, STEPS + 1):
    shutil.rmtree(os.path.join(g, "checkpoints", str(k)))
    os.remove(os.path.join(g, "checkpoints", "checksums", f"{k}.json"))
  run_g = lu.launch(g, config, f"--config.init_from={s}", f"--config.freeze_bilm_steps={FREEZE}", *ft,
                    log=logs["g"], **kw)
  assert lu.wait([run_g], timeout=900) == [0], lu.read(logs["g"])[-3000:]
  # The checkpoints' params per step, read where they were written (8 devices; see lu.DUMP_CHECKPOINT_PARAMS).
  wanted = [(s, 4), (r, 2), (r, 3)] + [(w, k) for w in (f, g) for k in range(1, STEPS + 1) if w == f or k >= 3]
  specs = [f"{w},{k},{w}-{k}.npz" for w, k in wanted]
  done = subprocess.run([sys.executable, "-c", lu.DUMP_CHECKPOINT_PARAMS, *specs], env=lu.env(devices=8),
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  params = {(w, k): dict(np.load(f"{w}-{k}.npz")) for w, k in wanted}
  return {"s": s, "f": f, "g": g, "r": r, "params": params,
          "released": lu.flat_params({"bilm": source}), **{n + "_log": lu.read(p) for n, p in logs.items()}}




def _part(flat: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
  return {k: v for k, v in flat.items() if k.startswith(f"['{name}']")}


def _assert_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
  assert sorted(a) == sorted(b) and a
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow
def test_frozen_phase_keeps_the_bilm_then_trains_it(runs):
  at = lambda w, k: runs["params"][(runs[w], k)]
  source = _part(at("s", 4), "bilm")
  for k in range(1, FREEZE + 1):
    _assert_equal(_part(at("f", k), "bilm"), source)
  w = "['softmax']['W']"
  assert not np.array_equal(at("f", 1)[w], at("f", FREEZE)[w])
  assert at("f", 1)[w].shape[0] != at("s", 4)[w].shape[0]  # another vocabulary: a new softmax
  moved = [k for k, v in _part(at("f", FREEZE + 1), "bilm").items() if not np.array_equal(v, source[k])]
  assert len(moved) >= len(source) - 2, sorted(set(source) - set(moved))  # all with a gradient move
  log = runs["f_log"]
  assert "(new vocabulary: new softmax)" in log and "consider --config.freeze_bilm_steps" not in log
  assert "biLM frozen for steps 1-3: only the softmax trains" in log
  assert "step 3: biLM unfrozen (config.freeze_bilm_steps=3)" in log


@pytest.mark.slow
def test_resume_inside_the_frozen_phase_is_bit_exact(runs):
  assert "resumed from step 2" in runs["g_log"] and "biLM frozen for steps 3-3" in runs["g_log"]
  a, b = lu.exported(runs["f"]), lu.exported(runs["g"])
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  assert lu.records(runs["f"]) == lu.records(runs["g"])
  for k in range(3, STEPS + 1):
    _assert_equal(runs["params"][(runs["f"], k)], runs["params"][(runs["g"], k)])


@pytest.mark.slow
def test_init_from_released_files_then_freeze(runs):
  assert "ELMo weights" in runs["r_log"] and "(new softmax)" in runs["r_log"]
  after_freeze, after = runs["params"][(runs["r"], 2)], runs["params"][(runs["r"], 3)]
  _assert_equal(_part(after_freeze, "bilm"), runs["released"])
  embed = "['bilm']['char_cnn']['char_embed']"
  assert not np.array_equal(after[embed], runs["released"][embed])
  with h5py.File(os.path.join(runs["r"], "export", "weights.hdf5"), "r") as f:
    assert "softmax" in f  # the fine-tuned run exports its new softmax
  assert json.load(open(os.path.join(runs["r"], "config.json")))["freeze_bilm_steps"] == 2
