"""Task models with ELMo (`elmo_jax.downstream`): none / frozen / finetune on tiny POS and sentiment files."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paths import FIXTURE_DIR, REPO_ROOT
from tiny import tiny_options
from elmo_jax.data import chars
from elmo_jax.downstream import data as data_lib
from elmo_jax.downstream import table, train
from elmo_jax.downstream.model import TaskConfig, TaskModel, init_params
from elmo_jax.evaluation import readers
from elmo_jax.model import BiLM

_NOUNS = "dog cat bird house tree car river bank".split()
_VERBS = "runs sees eats likes finds".split()


def write_task_data(root, n_train: int = 48, n_eval: int = 16, seed: int = 0) -> str:
  """pos/{train,dev,test}.conll and sentiment/{train,dev,test}.tsv under `root` (a learnable toy)."""
  rng = np.random.default_rng(seed)
  pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
  for task in ("pos", "sentiment"):
    os.makedirs(os.path.join(root, task), exist_ok=True)
  for split, n in (("train", n_train), ("dev", n_eval), ("test", n_eval)):
    with open(os.path.join(root, "pos", f"{split}.conll"), "w") as f:
      for _ in range(n):
        words = [("the", "DET"), (pick(_NOUNS), "NOUN"), (pick(_VERBS), "VERB"), ("a", "DET"),
                 (pick(_NOUNS), "NOUN"), (".", "PUNCT")][:int(rng.integers(3, 7))]
        f.write("".join(f"{w}\t{t}\n" for w, t in words) + "\n")
    with open(os.path.join(root, "sentiment", f"{split}.tsv"), "w") as f:
      for _ in range(n):
        y = int(rng.integers(2))
        word = pick(["good", "great"] if y else ["bad", "awful"])
        f.write(f"{y}\tthe {pick(_NOUNS)} is {word} .\n")
  return str(root)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
  return write_task_data(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def tiny_bilm():
  from elmo_jax.embedding.embedder import Embedder
  emb = Embedder.random(tiny_options(), seed=3)
  return train.Bilm(emb, {"spec": "tiny", "init": "random", "weights_sha256": "0" * 64})


def _splits(task_dir, task):
  paths = data_lib.resolve_paths(task, task_dir, {})
  return {name: data_lib.read_split(task, name, path) for name, path in paths.items()}


def _cfg(task, elmo, **kw):
  kw.setdefault("num_epochs", 2)
  kw.setdefault("batch_size", 8)
  model = dict({"hidden": 8, "word_dim": 8, "char_out": 8, "char_filters": ((1, 4), (2, 4))}, **kw.pop("model", {}))
  return train.DownstreamConfig(task=task, elmo=elmo, model=model, **kw)


# --- quick ---------------------------------------------------------------------------------------------
def test_missing_split_is_one_line_naming_the_flag(task_dir, tmp_path):
  with pytest.raises(readers.InputError) as e:
    data_lib.resolve_paths("pos", None, {"train": os.path.join(task_dir, "pos", "train.conll")})
  msg = str(e.value)
  assert "\n" not in msg and "no pos test split" in msg and "--test=FILE" in msg and "--data_dir" in msg
  with pytest.raises(readers.InputError, match=r"tfds:glue/sst2:train"):
    data_lib.resolve_paths("sentiment", str(tmp_path), {})
  # No dev split: held out of train (seeded, disjoint).
  train_split = data_lib.read_split("pos", "train", os.path.join(task_dir, "pos", "train.conll"))
  rest, dev = data_lib.hold_out(train_split, 0.25)
  assert len(rest.tokens) + len(dev.tokens) == len(train_split.tokens) and len(dev.tokens) == 12
  # A test tag never seen in training: one line naming file and line.
  bad = tmp_path / "bad.conll"
  bad.write_text("the\tDET\ndog\tNOUN\n\na\tDET\ncat\tXYZ\n")
  with pytest.raises(readers.InputError, match=r"bad.conll:5: unknown label 'XYZ'"):
    data_lib.check_labels("pos", data_lib.read_split("pos", "test", str(bad)),
                          data_lib.label_ids("pos", train_split))


def test_frozen_cache_equals_live_bilm(tiny_bilm):
  """The cached layers (Embedder, length-bucketed) are the BiLM's own forward on each padded batch;
  float32 to 1e-5, float16 to its rounding (relative 2^-10 of each value, plus 1e-4 near zero)."""
  sentences = [("the", "dog", "runs", "."), ("a", "bank"), ("river", "banks", "flood", "the", "old", "town")]
  enc = data_lib.Encoded(sentences, [np.zeros(len(s), np.int32) for s in sentences], [None] * 3,
                         np.concatenate([[0], np.cumsum([len(s) for s in sentences])]))
  emb = tiny_bilm.embedder
  live = jax.jit(lambda ids: BiLM(emb.config).apply({"params": emb.params}, ids)["layers"])(
      chars.batch_to_ids(sentences))
  want = np.concatenate([np.swapaxes(np.asarray(live[i, :, :len(s)]), 0, 1) for i, s in enumerate(sentences)])
  got32 = train.cache_layers(emb, enc, "float32", 2, "test")
  got16 = train.cache_layers(emb, enc, "float16", 2, "test")
  assert got32.shape == want.shape == (12, 3, 12)
  np.testing.assert_allclose(got32, want, rtol=1e-5, atol=1e-5)
  assert got16.dtype == np.float16
  np.testing.assert_allclose(got16.astype(np.float32), want, rtol=2 ** -10, atol=1e-4)


def test_mix_l2_is_in_the_loss():
  """loss(mix_l2=λ) - loss(mix_l2=0) = λ Σ_k ||w_k||² over both mixes (input and output)."""
  cfg = TaskConfig(task="pos", n_classes=3, vocab_size=5, elmo="frozen", elmo_at_output=True, hidden=4,
                   word_dim=4, char_out=4, char_filters=((1, 4),), n_bilm_layers=3)
  batch = {"word_ids": np.array([[2, 3, 0]], np.int32), "mask": np.array([[True, True, False]]),
           "char_ids": chars.batch_to_ids([["a", "b"]], max_chars=10, pad_to=3),
           "layers": np.random.default_rng(0).normal(size=(1, 3, 3, 6)).astype(np.float32),
           "labels": np.array([[0, 2, 0]], np.int32), "rows": np.array([True])}
  params = init_params(TaskModel(cfg), batch, 0)
  w0, w1 = np.array([0.5, -1.0, 2.0], np.float32), np.array([1.5, 0.0, -0.25], np.float32)
  params["scalar_mix_0"]["scalar_parameters"] = jnp.asarray(w0)
  params["scalar_mix_1"]["scalar_parameters"] = jnp.asarray(w1)
  losses = {}
  for lam in (0.0, 0.25):
    model = TaskModel(TaskConfig(**dict(cfg.__dict__, mix_l2=lam)))
    loss_fn = jax.jit(train.make_loss(model), static_argnames="deterministic")  # one compile, not one per op
    loss, aux = loss_fn(params, batch, jax.random.key(0), deterministic=True)
    losses[lam] = (float(loss), float(aux["ce"]), float(aux["l2"]))
  expected = 0.25 * float(np.sum(w0 ** 2) + np.sum(w1 ** 2))  # 0.25 * (5.25 + 2.3125)
  assert losses[0.25][2] == pytest.approx(expected, rel=1e-6)
  assert losses[0.25][0] - losses[0.0][0] == pytest.approx(expected, rel=1e-5)
  assert losses[0.25][1] == pytest.approx(losses[0.0][1], rel=1e-6)


def test_table_mean_std_over_seeds():
  def res(task, elmo, seed, acc, **extra):
    return dict({"task": task, "elmo": elmo, "seed": seed, "test_accuracy": acc, "dev_accuracy": acc - 0.01},
                **extra)
  results = [res("pos", "none", 0, 0.90), res("pos", "none", 1, 0.92), res("pos", "frozen", 0, 0.93),
             res("pos", "frozen", 1, 0.95), res("pos", "frozen", 2, 0.97),
             res("pos", "frozen", 0, 0.5, bilm={"init": "random"}), res("sentiment", "finetune", 0, 0.8)]
  summary = table.summarise(results)
  rows = {(r["task"], r["setting"]): r for r in summary["rows"]}
  assert [r["setting"] for r in summary["rows"]] == ["none", "frozen", "frozen (random biLM)", "finetune"]
  frozen = rows[("pos", "frozen")]
  assert frozen["n"] == 3 and frozen["seeds"] == [0, 1, 2]
  assert frozen["mean"] == pytest.approx(0.95) and frozen["std"] == pytest.approx(0.02)  # sample std
  assert rows[("pos", "none")]["std"] == pytest.approx(np.std([0.90, 0.92], ddof=1))
  assert frozen["delta_vs_none"] == pytest.approx(0.95 - 0.91)
  assert rows[("sentiment", "finetune")]["std"] == 0.0 and rows[("sentiment", "finetune")]["delta_vs_none"] is None
  text = table.markdown(summary)
  assert "| pos | frozen | 0.9500 ± 0.0200 | +0.0400 | 0.9400 | 3 |" in text


def test_table_names_the_bilm_when_it_compares_several():
  def res(elmo, seed, bilm=None):
    return {"task": "sentiment", "elmo": elmo, "seed": seed, "test_accuracy": 0.8, "dev_accuracy": 0.8,
            "bilm": bilm}
  ref = {"spec": "/abs/runs/reference", "weights_sha256": "a" * 64}
  results = [res("none", 0), res("frozen", 0, ref), res("frozen", 1, dict(ref, spec="runs/reference/")),
             res("frozen", 0, {"spec": "runs/ref_sentdom", "weights_sha256": "b" * 64})]
  settings = [r["setting"] for r in table.summarise(results)["rows"]]
  assert settings == ["none", "frozen [ref_sentdom]", "frozen [reference]"]  # the same weights: one row
  assert [r["setting"] for r in table.summarise(results[:3])["rows"]] == ["none", "frozen"]


# --- end to end (seconds of compiling each) ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("task", ["pos", "sentiment"])
def test_settings_train_end_to_end(task_dir, tiny_bilm, task):
  """none / frozen / finetune all train; frozen leaves the biLM bit-identical, finetune moves it."""
  before = jax.tree_util.tree_map(np.array, tiny_bilm.embedder.params)
  out = {}
  for elmo in ("none", "frozen", "finetune"):
    out[elmo] = train.run(_cfg(task, elmo, model={"elmo_at_output": task == "pos"}), _splits(task_dir, task),
                          tiny_bilm if elmo != "none" else None)
    r = out[elmo]
    assert {"test_accuracy", "dev_accuracy", "best_epoch", "dev_curve", "settings", "data", "bilm",
            "mixes", "seconds"} <= set(r)
    assert 0.0 <= r["test_accuracy"] <= 1.0 and len(r["dev_curve"]) == 2
    assert r["data"]["train"]["sha256"] == data_lib.files.sha256_file(
        os.path.join(task_dir, task, "train.conll" if task == "pos" else "train.tsv"))
  assert "bilm" not in out["none"]["_params"] and not out["none"]["mixes"]
  assert "bilm" not in out["frozen"]["_params"]
  assert set(out["frozen"]["mixes"]) == ({"scalar_mix_0", "scalar_mix_1"} if task == "pos" else {"scalar_mix_0"})
  assert sum(out["frozen"]["mixes"]["scalar_mix_0"]["weights"]) == pytest.approx(1.0, abs=1e-6)
  # Frozen: the embedder's biLM is bit-identical after training.
  jax.tree_util.tree_map(np.testing.assert_array_equal, before, jax.device_get(tiny_bilm.embedder.params))
  # Finetune: its biLM copy moved (every char-CNN and LSTM group gets gradient).
  tuned = jax.device_get(out["finetune"]["_params"]["bilm"])
  moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: bool(np.any(a != b)), before, tuned))
  assert sum(moved) >= len(moved) // 2, moved


@pytest.mark.slow
def test_early_stopping_tests_the_best_dev_epoch(task_dir, monkeypatch):
  scripted = iter([0.5, 0.7, 0.6, 0.65, 0.9])
  seen = []

  def fake_evaluate(eval_step, params, data, batch_iter):
    seen.append(jax.device_get(params))
    return next(scripted, -1.0)
  monkeypatch.setattr(train, "evaluate", fake_evaluate)
  r = train.run(_cfg("pos", "none", num_epochs=5, patience=2), _splits(task_dir, "pos"))
  assert [row["dev_accuracy"] for row in r["dev_curve"]] == [0.5, 0.7, 0.6, 0.65]  # stopped: 2 worse epochs
  assert r["best_epoch"] == 2 and r["dev_accuracy"] == 0.7 and r["epochs_run"] == 4
  # The test split is scored with epoch 2's params (5th call), not the last epoch's.
  jax.tree_util.tree_map(np.testing.assert_array_equal, seen[4], seen[1])
  assert any(np.any(a != b) for a, b in zip(jax.tree_util.tree_leaves(seen[4]), jax.tree_util.tree_leaves(seen[3])))


def _cli(*args, cwd=REPO_ROOT):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=600)


@pytest.mark.slow
def test_cli_runs_and_tables(task_dir, tmp_path):
  runs = []
  for elmo, seed in (("none", 0), ("frozen", 0), ("frozen", 1)):
    out = str(tmp_path / f"sent-{elmo}-{seed}")
    cap = ["--max_train_sentences=40"] if elmo == "none" else []  # of 48
    p = _cli("elmo_jax", "downstream", "--task=sentiment", f"--elmo={elmo}", f"--bilm={FIXTURE_DIR}",
             f"--data_dir={task_dir}", f"--workdir={out}", f"--seed={seed}", "--num_epochs=2", "--hidden=8",
             f"--layer_cache_dir={tmp_path / 'layers'}", *cap)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.load(open(os.path.join(out, "results.json")))
    assert r["elmo"] == elmo and r["seed"] == seed and os.path.exists(os.path.join(out, "dev_curve.png"))
    # The progress line says what is trained on, as results.json does.
    n_train = 40 if cap else 48
    assert r["data"]["train"]["sentences"] == n_train
    assert (f"train {n_train} of 48 sentences (--max_train_sentences)" if cap else "train 48 sentences") in p.stderr
    if elmo == "frozen":
      from elmo_jax.runtime import files
      assert r["bilm"]["weights_sha256"] == files.sha256_file(os.path.join(FIXTURE_DIR, "lm_weights.hdf5"))
    runs.append(out)
  # The frozen biLM layers of train/dev/test were written once and reused by the second seed.
  assert len(os.listdir(tmp_path / "layers")) == 3
  p = _cli("elmo_jax", "downstream", "table", *runs, f"--output={tmp_path / 'summary'}")
  assert p.returncode == 0, p.stderr
  summary = json.load(open(tmp_path / "summary" / "downstream.json"))
  assert [(r["setting"], r["n"]) for r in summary["rows"]] == [("none", 1), ("frozen", 2)]
  assert "| sentiment | frozen |" in p.stdout
  # A missing split: one line on stderr naming the flag, exit 1, nothing written.
  p = _cli("elmo_jax", "downstream", "--task=pos", f"--train={task_dir}/pos/train.conll",
           f"--workdir={tmp_path / 'bad'}")
  assert p.returncode == 1 and p.stderr.strip().count("\n") == 0, p.stderr
  assert "no pos test split" in p.stderr and "--test=FILE" in p.stderr
  assert not os.path.exists(tmp_path / "bad")
  _run_notebook(tmp_path)


def _run_notebook(results_dir) -> None:
  """notebooks/downstream_results.ipynb on `results_dir` (the runs + summary above, plus probe and
  perplexity JSONs in evaluate.py's layout) draws every plot without an error."""
  nbclient = pytest.importorskip("nbclient")
  nbformat = pytest.importorskip("nbformat")
  kernelspec = pytest.importorskip("ipykernel.kernelspec")
  probe = lambda acc: {"trained": {"layer_0": acc, "layer_1": acc + 0.1, "layer_2": acc + 0.05, "mix": acc + 0.1},
                       "untrained": {"layer_0": acc, "layer_1": acc - 0.1, "layer_2": acc - 0.1}}  # noqa: E731
  os.makedirs(results_dir / "eval")
  for task, acc in (("pos", 0.8), ("wsd", 0.1), ("sentiment", 0.6)):
    (results_dir / "eval" / f"{task}.json").write_text(json.dumps(probe(acc)))
  # An older run kept below the folder (as results/reference/steps_5000/): its name sorts first, yet the
  # folder's own eval/ is the one drawn.
  os.makedirs(results_dir / "a_older_run" / "eval")
  (results_dir / "a_older_run" / "eval" / "pos.json").write_text(json.dumps(probe(0.5)))
  (results_dir / "perplexity_pd-mix.json").write_text(json.dumps(
      {"ppl_forward": 120.0, "ppl_backward": 130.0, "ppl": 125.0, "unigram_ppl": 900.0}))
  prefix = str(results_dir / "jupyter")
  kernelspec.install(kernel_name="elmo-jax-test", prefix=prefix)
  env = {"JUPYTER_PATH": os.path.join(prefix, "share", "jupyter"), "ELMO_RESULTS": str(results_dir),
         "JAX_PLATFORMS": "cpu"}
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    nb = nbformat.read(os.path.join(REPO_ROOT, "notebooks", "downstream_results.ipynb"), as_version=4)
    nbclient.NotebookClient(nb, kernel_name="elmo-jax-test", timeout=300,
                            resources={"metadata": {"path": str(results_dir)}}).execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == 3, [o.get("output_type") for o in outputs]  # settings bars, probes, perplexity
  text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
  # The table is displayed as Markdown (a table on the docs page), not printed as `| ... |` text.
  markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
  assert "| sentiment | frozen |" in markdown and "| sentiment | frozen |" not in text
  assert "pos: eval/pos.json" in text and "a_older_run" not in text
