"""The trainer (issue 3): sharded equivalence, config handling, an end-to-end run, failure modes, bf16.

Everything is tiny (LSTM 32 units, P=8, a 25-word corpus, batch 8 x 5 tokens) so the file runs in about a
minute of CPU; the slow parts (compiles) are shared through one module-scoped training run.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import textwrap

import h5py
import jax
import numpy as np
import pytest

from elmo_jax.formats import options as options_lib
from elmo_jax.training.config import base_config, unknown_override_error

import launch_util
import tiny
from paths import REPO_ROOT, TESTS_DIR

PYTHON = sys.executable

_SUBJ = ["the cat", "the dog", "a bird", "my friend", "the old man"]
_VERB = ["sat on", "looked at", "ran to", "jumped over"]
_OBJ = ["the mat", "the house", "a tree", "the river"]
REQUIRED_TRAIN_KEYS = {"step", "train_loss", "train_ppl_forward", "train_ppl_backward", "learning_rate",
                       "grad_norm", "tokens_per_sec", "elapsed_sec"}
REQUIRED_EVAL_KEYS = {"step", "eval_ppl_forward", "eval_ppl_backward", "eval_ppl"}


def _sentences(n: int, seed: int) -> list[str]:
  """A repetitive toy grammar: 5 x 4 x 4 sentences of 7 words + '.'; easy to learn, hard for unigrams."""
  r = np.random.RandomState(seed)
  return [f"{_SUBJ[r.randint(5)]} {_VERB[r.randint(4)]} {_OBJ[r.randint(4)]} ." for _ in range(n)]


def _write_corpus(directory) -> tuple[str, str]:
  train, evals = os.path.join(directory, "train.txt"), os.path.join(directory, "eval.txt")
  with open(train, "w") as f:
    f.write("\n".join(_sentences(400, 0)) + "\n")
  with open(evals, "w") as f:
    f.write("\n".join(_sentences(40, 1)) + "\n")
  return train, evals


def tiny_config(corpus_dir, **overrides):
  train, evals = _write_corpus(corpus_dir)
  return tiny.train_config(train, evals, **{"batch_size": 8, "data.vocab_max_size": 300, **overrides})


def _restore_raw(checkpoint_state_dir: str) -> dict:
  """A saved TrainState as plain numpy trees, without a restore target."""
  import orbax.checkpoint as ocp
  with ocp.StandardCheckpointer() as ckptr:
    return jax.tree_util.tree_map(np.asarray, ckptr.restore(checkpoint_state_dir))


def _checkpoint_steps(workdir: str) -> list[int]:
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def _read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


# --- 1. sharded equivalence ---------------------------------------------------------------------------------
_SHARDED_SCRIPT = textwrap.dedent(r"""
  import json, os, sys
  import jax, numpy as np
  from elmo_jax.data import Tokenizer, Vocab, make_lm_iterator
  from elmo_jax.formats import options as options_lib
  from elmo_jax.model import make_model
  from elmo_jax.training import feed, optimizer as optimizer_lib, step as step_lib
  sys.path[:0] = sys.argv[1].split(os.pathsep)
  from test_train import tiny_config, _sentences

  assert jax.device_count() == 8, jax.devices()
  c = tiny_config(sys.argv[2], dropout=0.3, n_negative_samples=12)
  sentences = _sentences(200, 0)
  tok = Tokenizer(pretokenized=True)
  vocab = Vocab.build(tok(s) for s in sentences)
  num_sampled = c.n_negative_samples
  assert 0 < num_sampled < len(vocab) - 1  # the sampled softmax is exercised, with dropout on
  model = make_model(options_lib.validate(c.options.to_dict()), dropout=c.dropout, dtype=c.dtype)
  optimizer = optimizer_lib.make_optimizer(c)

  def run(devices, dedupe, n_steps=5, shard_softmax=False):
    mesh = step_lib.make_mesh(devices)
    create = lambda: step_lib.create_train_state(model, optimizer, len(vocab), c.batch_size, c.seed)
    shardings = step_lib.state_shardings(jax.eval_shape(create), mesh, shard_softmax)
    if shard_softmax:
      assert shardings.params["softmax"]["W"].spec == jax.sharding.PartitionSpec(None, "data")
    state = jax.jit(create, out_shardings=shardings)()
    train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
    batches = make_lm_iterator(sentences, vocab, tok, batch_size=c.batch_size, unroll_steps=c.unroll_steps,
                               seed=c.seed, process_index=0, process_count=1,
                               dedupe_shards=len(devices) if dedupe else None)
    out = []
    for _ in range(n_steps):
      batch = feed.device_batch(next(batches), mesh)
      assert ("token_chars" in batch) == dedupe
      if dedupe:  # one table per device, each on the device that holds its rows
        assert len(batch["token_chars"].sharding.device_set) == len(devices) == batch["token_chars"].shape[0]
      state, metrics = train_step(state, batch)
      out.append({k: float(v) for k, v in jax.device_get(metrics).items()})
    n_shards = len(state.lstm_state[0].sharding.device_set)
    return out, jax.device_get(state.params), jax.device_get(state.lstm_state), n_shards

  diff = lambda a, b: max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
                          for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
  initial = jax.device_get(jax.jit(lambda: step_lib.create_train_state(
      model, optimizer, len(vocab), c.batch_size, c.seed))().params)
  # The 1-device reference never dedupes nor splits the softmax: one run serves every 8-device variant.
  m1, p1, s1, shards1 = run(jax.devices()[:1], False)
  results = {}
  for name in sys.argv[3].split(","):
    dedupe_8 = name != "plain"  # the 8-device run dedupes its tokens per shard; the 1-device run never does
    shard_softmax_8 = name == "dedupe-sharded-softmax"  # the 8-device run splits the softmax over the devices
    m8, p8, s8, shards8 = run(jax.devices(), dedupe_8, shard_softmax=shard_softmax_8)
    results[name] = {
        "shards": [shards8, shards1],
        "losses_8": [m["loss"] for m in m8], "losses_1": [m["loss"] for m in m1],
        "max_loss_diff": max(abs(a["loss"] - b["loss"]) for a, b in zip(m8, m1)),
        "max_grad_norm_diff": max(abs(a["grad_norm"] - b["grad_norm"]) for a, b in zip(m8, m1)),
        "max_param_diff": diff(p8, p1), "max_lstm_state_diff": diff(s8, s1),
        "max_param_change": diff(p8, initial),
        "threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
    }
  print(json.dumps(results))
""")
_SHARDED_VARIANTS = ("plain", "dedupe", "dedupe-sharded-softmax")


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory):
  """One subprocess on 8 simulated devices runs every variant against one shared 1-device reference."""
  tmp_path = tmp_path_factory.mktemp("sharded")
  script = tmp_path / "sharded.py"
  script.write_text(_SHARDED_SCRIPT)
  env = {**os.environ, "XLA_FLAGS": launch_util.xla_flags(8), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([PYTHON, str(script), os.pathsep.join((os.path.dirname(__file__), TESTS_DIR)), str(tmp_path),
                         ",".join(_SHARDED_VARIANTS)], env=env, capture_output=True, text=True, timeout=900,
                        cwd=REPO_ROOT)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("variant", _SHARDED_VARIANTS)
def test_sharded_training_equals_single_device(sharded_results, variant):
  """8 devices vs 1, same global batch and seed, dropout and sampled softmax on: same losses and params.

  With `dedupe`, the 8-device run embeds each shard's distinct tokens (data/dedupe.py) and the 1-device
  run every position: also the deduped path against the plain one. With `shard_softmax`, the 8-device run
  splits the softmax W and its optimizer state over the devices (config.shard_softmax).
  """
  result = sharded_results[variant]
  print("8 vs 1 device:", json.dumps(result, indent=1))
  assert result["shards"] == [8, 1]  # the LSTM state rows really were split over 8 devices
  assert all(math.isfinite(x) for x in result["losses_8"])
  assert result["max_param_change"] > 1e-3  # training moved the params, so equality means something
  assert result["max_loss_diff"] <= 1e-5
  assert result["max_grad_norm_diff"] <= 1e-5
  assert result["max_param_diff"] <= 1e-5
  assert result["max_lstm_state_diff"] <= 1e-5


# --- 3. config --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag, key, words", [
    ("--config.no_such_key=1", "no_such_key", "unknown config key"),
    ("--config.options.lstm.dimm=3", "options.lstm.dimm", "did you mean 'dim'"),
    ("--config.batch_size=abc", "batch_size", "invalid literal"),
])
@pytest.mark.slow
def test_train_py_refuses_bad_overrides_in_one_line(tmp_path, flag, key, words):
  proc = subprocess.run([PYTHON, "train.py", f"--workdir={tmp_path / 'run'}", flag], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  out = proc.stdout + proc.stderr
  assert proc.returncode != 0
  assert f"config.{key}" in out and words in out, out
  assert "Traceback" not in out, out
  assert not (tmp_path / "run").exists()  # refused before anything was written


def test_unknown_override_error_helper():
  default = os.path.join(REPO_ROOT, "configs", "default.py")
  assert unknown_override_error(["train.py", "--config.batch_size=3", "--noconfig.data.pretokenized"],
                                default) is None
  assert unknown_override_error(["train.py", "--config.options.char_cnn.filters=[[1,2]]"], default) is None
  msg = unknown_override_error(["train.py", "--config.data.vocab_max_sise=3"], default)
  assert "config.data.vocab_max_sise" in msg and "vocab_max_size" in msg
  # The config file given on the command line is the one checked (also as `--config PATH`).
  small = os.path.join(REPO_ROOT, "configs", "small.py")
  assert "options.lstm.x" in unknown_override_error(["t", "--config", small, "--config.options.lstm.x=1"], default)
  assert unknown_override_error(["t", f"--config={small}", "--config.options.lstm.dim=8"], default) is None
  # A config file that does not load is left to config_flags.
  assert unknown_override_error(["t", "--config=/nonexistent.py", "--config.x=1"], default) is None


def _load_config_file(path):
  spec = importlib.util.spec_from_file_location(f"_cfg_{os.path.basename(path)[:-3]}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO_ROOT, "configs", "*.py"))),
                         ids=lambda p: os.path.basename(p))
def test_config_files_load_and_validate(path, tmp_path):
  c = _load_config_file(path)
  if os.path.basename(path) == "finetune.py":  # its shape comes from init_from: here the TF-Hub fixture's
    from elmo_jax.training import variant  # pylint: disable=g-import-not-at-top
    from paths import TFHUB_MODULE  # pylint: disable=g-import-not-at-top
    c.init_from = TFHUB_MODULE
    c = variant.resolve(c, str(tmp_path / "run"))
  options = options_lib.validate(c.options.to_dict(), path)
  base = base_config()
  assert set(c.keys()) == set(base.keys()), path  # no typos: every config has exactly the base keys
  assert set(c.data.keys()) == set(base.data.keys()), path
  assert (c.batch_size > 0) != (c.per_device_batch_size > 0)  # exactly one of the two (lm1b: per device)
  assert c.unroll_steps > 0 and c.num_train_steps > 0
  assert c.dtype in ("float32", "bfloat16") and c.optimizer in ("adagrad", "adam", "adamw")
  assert options["lstm"]["projection_dim"] > 0


@pytest.mark.parametrize("name, dim, proj, highway", [("small", 1024, 128, 1), ("medium", 2048, 256, 1),
                                                      ("original", 4096, 512, 2)])
def test_released_presets_have_released_sizes(name, dim, proj, highway):
  c = _load_config_file(os.path.join(REPO_ROOT, "configs", f"{name}.py"))
  o = options_lib.validate(c.options.to_dict())
  assert (o["lstm"]["dim"], o["lstm"]["projection_dim"], o["char_cnn"]["n_highway"]) == (dim, proj, highway)
  assert o["lstm"]["n_layers"] == 2 and o["lstm"]["use_skip_connections"]
  assert options_lib.n_filters(o) == 2048
  assert o["lstm"]["cell_clip"] == 3 and o["lstm"]["proj_clip"] == 3
  assert (c.optimizer, c.learning_rate, c.n_negative_samples) == ("adagrad", 0.2, 8192)


# --- optimizer ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("warmup", [0, 4])
def test_logged_learning_rate_is_the_one_each_update_applied(warmup):
  """Adagrad with gradient 1: update k is -lr_k / sqrt(1 + k), so lr_k is read off the update itself."""
  import jax.numpy as jnp
  from elmo_jax.training import optimizer as optimizer_lib
  c = base_config()
  c.warmup_steps = warmup
  optimizer = optimizer_lib.make_optimizer(c)
  params = {"x": jnp.zeros(())}
  opt_state = optimizer.init(params)
  for k in range(1, 7):
    updates, opt_state = optimizer.update({"x": jnp.ones(())}, opt_state, params)
    applied = float(-updates["x"] * jnp.sqrt(1.0 + k))
    assert applied == pytest.approx(optimizer_lib.learning_rate_at(c, k), rel=1e-5), (k, applied)
    assert applied > 0  # no update is wasted at rate 0
  assert optimizer_lib.learning_rate_at(c, 6) == pytest.approx(c.learning_rate)


# --- 4 + 7. end to end ------------------------------------------------------------------------------------
N_STEPS = 40


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """One real run: 40 steps (Adam, full softmax, dropout 0.1), logs every 10, evals and saves every 20."""
  from elmo_jax.training.loop import train_and_evaluate
  base = tmp_path_factory.mktemp("e2e")
  c = tiny_config(base, optimizer="adam", learning_rate=0.03, num_train_steps=N_STEPS, log_every_steps=10,
                  eval_every_steps=20, checkpoint_every_steps=20)
  workdir = str(base / "run")
  record = train_and_evaluate(c, workdir)
  return {"workdir": workdir, "record": record, "config": c, "dir": str(base)}


@pytest.mark.slow
def test_metrics_jsonl_has_required_keys_and_loss_decreases(trained):
  records = _read_metrics(trained["workdir"])
  train = [r for r in records if "train_loss" in r]
  evals = [r for r in records if "eval_ppl" in r]
  assert [r["step"] for r in train] == [10, 20, 30, 40]
  assert [r["step"] for r in evals] == [20, 40]
  for r in train:
    assert REQUIRED_TRAIN_KEYS <= set(r), set(r)
    assert all(math.isfinite(r[k]) for k in REQUIRED_TRAIN_KEYS)
    assert r["tokens_per_sec"] > 0 and r["grad_norm"] > 0 and r["learning_rate"] == pytest.approx(0.03)
    assert r["train_loss"] == pytest.approx(0.5 * (math.log(r["train_ppl_forward"]) +
                                                   math.log(r["train_ppl_backward"])), rel=1e-6)
  for r in evals:
    assert REQUIRED_EVAL_KEYS <= set(r), set(r)
    assert r["eval_ppl"] == pytest.approx(math.sqrt(r["eval_ppl_forward"] * r["eval_ppl_backward"]), rel=1e-6)
  elapsed = [r["elapsed_sec"] for r in train]
  assert elapsed == sorted(elapsed)
  assert train[-1]["train_loss"] < train[0]["train_loss"] - 0.3, [r["train_loss"] for r in train]
  assert evals[-1]["eval_ppl"] < evals[0]["eval_ppl"]
  # The returned record is the last logged one, with the last eval merged in.
  assert trained["record"]["step"] == N_STEPS
  assert trained["record"]["eval_ppl"] == pytest.approx(evals[-1]["eval_ppl"])


@pytest.mark.slow
def test_run_learns_far_below_unigram(trained):
  records = _read_metrics(trained["workdir"])
  unigram = [r for r in records if "unigram_ppl" in r]
  assert len(unigram) == 1 and unigram[0]["step"] == 0 and unigram[0]["oov_rate"] == 0.0
  final = [r for r in records if "eval_ppl" in r][-1]
  print(f"unigram ppl {unigram[0]['unigram_ppl']:.2f}, eval ppl after {N_STEPS} steps {final['eval_ppl']:.2f}")
  assert 10 < unigram[0]["unigram_ppl"] < 30  # ~18 on this grammar
  assert final["eval_ppl"] < 0.6 * unigram[0]["unigram_ppl"]
  assert final["eval_ppl_forward"] < 0.6 * unigram[0]["unigram_ppl"]


@pytest.mark.slow
def test_run_writes_config_vocab_tensorboard_checkpoints(trained):
  workdir = trained["workdir"]
  with open(os.path.join(workdir, "config.json")) as f:
    saved = json.load(f)
  assert saved["batch_size"] == 8 and saved["options"]["lstm"]["dim"] == 32 and saved["optimizer"] == "adam"
  with open(os.path.join(workdir, "vocab.txt")) as f:
    vocab = [line.rstrip("\n") for line in f]
  assert {"<S>", "</S>", "<UNK>", "cat", "river", "."} <= set(vocab) and len(vocab) == len(set(vocab))
  events = glob.glob(os.path.join(workdir, "tensorboard", "**", "events.out.tfevents*"), recursive=True)
  assert events, os.listdir(workdir)
  blob = b"".join(open(e, "rb").read() for e in events)
  for tag in (b"train_loss", b"eval_ppl", b"tokens_per_sec", b"unigram_ppl"):
    assert tag in blob
  assert _checkpoint_steps(workdir) == [20, 40]


@pytest.mark.slow
def test_export_matches_trained_params_and_embeds(trained):
  from elmo_jax.embedding.embedder import Embedder
  from elmo_jax.formats import weights as weights_lib
  workdir = trained["workdir"]
  export = os.path.join(workdir, "export")
  state = _restore_raw(os.path.join(workdir, "checkpoints", str(N_STEPS), "state"))
  assert int(state["step"]) == N_STEPS
  with h5py.File(os.path.join(export, "weights.hdf5"), "r") as f:
    np.testing.assert_array_equal(f["softmax/W"][...], state["params"]["softmax"]["W"])
    np.testing.assert_array_equal(f["softmax/b"][...], state["params"]["softmax"]["b"])
  options = options_lib.load(os.path.join(export, "options.json"))
  assert options == options_lib.validate(trained["config"].options.to_dict())
  loaded = weights_lib.load_hdf5(os.path.join(export, "weights.hdf5"), options)
  flat_ckpt = jax.tree_util.tree_flatten_with_path(state["params"]["bilm"])[0]
  flat_export = dict(jax.tree_util.tree_flatten_with_path(loaded["params"])[0])
  assert len(flat_ckpt) == len(flat_export)
  for path, value in flat_ckpt:
    np.testing.assert_array_equal(np.asarray(flat_export[path]), value, err_msg=jax.tree_util.keystr(path))
  assert open(os.path.join(export, "vocab.txt")).read() == open(os.path.join(workdir, "vocab.txt")).read()

  sentence = ["the", "cat", "sat", "on", "the", "mat", "."]
  a = Embedder.from_workdir(workdir)
  b = Embedder.from_files(os.path.join(export, "options.json"), os.path.join(export, "weights.hdf5"))
  ea, eb = a.embed_sentences([sentence])[0], b.embed_sentences([sentence])[0]
  assert ea.shape == (3, len(sentence), 16)
  assert np.all(np.isfinite(ea)) and np.abs(ea[1:]).max() > 0
  np.testing.assert_allclose(ea, eb, rtol=1e-6, atol=1e-6)
  assert a.vocab_file and a.vocab_file.endswith("vocab.txt")
  # the run's export (whose softmax equals the trained one, above) is what `from_workdir` loaded
  assert a.model_files == (os.path.join(export, "options.json"), os.path.join(export, "weights.hdf5"))

  inp, out = os.path.join(trained["dir"], "sentences.txt"), os.path.join(trained["dir"], "emb.hdf5")
  with open(inp, "w") as f:
    f.write(" ".join(sentence) + "\n" + "a bird ran to the river .\n")
  proc = subprocess.run([PYTHON, "-m", "elmo_jax", "embed", f"--workdir={workdir}", f"--input_file={inp}",
                         f"--output_file={out}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  with h5py.File(out, "r") as f:
    np.testing.assert_allclose(f["0"][...], ea, rtol=1e-4, atol=1e-4)
    assert f["1"].shape == (3, 7, 16)


# --- 5. non-finite loss -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_non_finite_loss_stops_naming_the_step_and_saves_nothing_for_it(tmp_path):
  from elmo_jax.training.loop import train_and_evaluate
  # Adagrad moves every weight by ~lr on the first step: 1e38 overflows the logits of step 2.
  c = tiny_config(tmp_path, learning_rate=1e38, grad_clip=1e38, num_train_steps=6, log_every_steps=1,
                  checkpoint_every_steps=1, eval_every_steps=100)
  c.data.eval_files = ""
  workdir = str(tmp_path / "run")
  import signal
  handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
  with pytest.raises(Exception, match=r"(?i)non-finite") as info:
    train_and_evaluate(c, workdir)
  leaked = [sig.name for sig, h in handlers.items() if signal.getsignal(sig) is not h]
  for sig, h in handlers.items():  # whatever the loop left, later tests get the original handlers back
    signal.signal(sig, h)
  m = re.search(r"step (\d+)", str(info.value))
  assert m, str(info.value)
  bad = int(m.group(1))
  assert 1 <= bad <= 6
  logged = [r["step"] for r in _read_metrics(workdir) if "train_loss" in r]
  assert logged == list(range(1, bad))  # every finished step was logged, the bad one was not
  entries = os.listdir(os.path.join(workdir, "checkpoints"))
  assert not [e for e in entries if e.split(".")[0] == str(bad) or e.startswith(f"{bad}.")], entries
  assert all(s < bad for s in _checkpoint_steps(workdir))
  if bad > 1:  # the export is the last good step's, not the bad one's
    import time
    deadline = time.time() + 60  # the failed run's last async save may still be finalizing
    while bad - 1 not in _checkpoint_steps(workdir) and time.time() < deadline:
      time.sleep(0.2)
    state = _restore_raw(os.path.join(workdir, "checkpoints", str(bad - 1), "state"))
    with h5py.File(os.path.join(workdir, "export", "weights.hdf5"), "r") as f:
      np.testing.assert_array_equal(f["softmax/W"][...], state["params"]["softmax"]["W"])
  assert not leaked, f"train_and_evaluate left its {leaked} handlers installed after the error"


# --- 6. bfloat16 ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bfloat16_trains_with_finite_loss_and_float32_params(tmp_path):
  from elmo_jax.training.loop import train_and_evaluate
  c = tiny_config(tmp_path, dtype="bfloat16", num_train_steps=4, log_every_steps=1, checkpoint_every_steps=4,
                  eval_every_steps=100, n_negative_samples=8)  # sampled softmax in bf16 too
  c.data.eval_files = ""
  workdir = str(tmp_path / "run")
  record = train_and_evaluate(c, workdir)
  losses = [r["train_loss"] for r in _read_metrics(workdir) if "train_loss" in r]
  assert len(losses) == 4 and all(math.isfinite(x) and 0 < x < 10 for x in losses), losses
  assert record["step"] == 4
  state = _restore_raw(os.path.join(workdir, "checkpoints", "4", "state"))
  dtypes = {x.dtype for x in jax.tree_util.tree_leaves(state["params"])}
  assert dtypes == {np.dtype(np.float32)}, dtypes
  opt_dtypes = {x.dtype for x in jax.tree_util.tree_leaves(state["opt_state"]) if x.ndim}
  assert opt_dtypes == {np.dtype(np.float32)}, opt_dtypes
  assert {x.dtype for x in jax.tree_util.tree_leaves(state["lstm_state"])} == {np.dtype(np.float32)}
