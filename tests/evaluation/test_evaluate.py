"""Tests of the probing suite (evaluate.py, elmo_jax/evaluation) with a fake embedder."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import evaluate
from elmo_jax.evaluation import early_stopping, features, plots, probes, readers, report, tasks, wsd
from eval_util import FAST, FakeEmbedder, eval_cfg, fake_models, write, wsd_tsv
from paths import REPO_ROOT


# ---------------------------------------------------------------- readers


def test_readers_name_the_bad_line(tmp_path):
  bad = write(tmp_path / "w.tsv", "bank\tnoun\ts1\t0\tbank x\nbank\tnoun\ts2\t0\n")
  with pytest.raises(readers.InputError, match=r"w\.tsv:2: expected 5 tab-separated"):
    readers.read_wsd(bad)
  bad = write(tmp_path / "i.tsv", "bank\tnoun\ts1\t7\tbank x\n")
  with pytest.raises(readers.InputError, match=r"i\.tsv:1: token_index 7"):
    readers.read_wsd(bad)
  bad = write(tmp_path / "p.conll", "the\tDT\ncat\tNN\n\ndog NN\n")
  with pytest.raises(readers.InputError, match=r"p\.conll:4: expected 2"):
    readers.read_conll(bad)
  bad = write(tmp_path / "s.tsv", "1\tgood film\n0\tbad\tfilm\n")
  with pytest.raises(readers.InputError, match=r"s\.tsv:2: expected 2"):
    readers.read_labelled(bad)
  with pytest.raises(readers.InputError, match="nope.tsv: file not found"):
    readers.read_labelled(str(tmp_path / "nope.tsv"))


def test_conll_sentences_and_tokenizer(tmp_path):
  sents = readers.read_conll(write(tmp_path / "p.conll", "the\tDT\ncat\tNN\n\n\nit\tPRP\n"))
  assert [s.tokens for s in sents] == [("the", "cat"), ("it",)]
  assert [s.line for s in sents] == [1, 5]
  assert readers.tokenize("It's not bad, isn't it?") == [
      "It", "'s", "not", "bad", ",", "is", "n't", "it", "?"]


# ---------------------------------------------------------------- wsd


def test_wsd_known_answer_and_ties(tmp_path):
  rows = readers.read_wsd(write(tmp_path / "w.tsv", wsd_tsv()))
  emb = FakeEmbedder()
  feats = features.target_features(emb, [r.tokens for r in rows],
                                   [r.token_index for r in rows])
  res = wsd.nearest_neighbour(rows, feats)
  assert res["n"] == 6 and res["n_groups"] == 1 and res["n_answerable"] == 6  # 'solo' has one sense: excluded
  assert res["layer_0"] == 0.0 and res["layer_0_ties"] == 1.0  # one vector per type
  assert res["layer_0_excluding_ties"] is None
  assert res["layer_1"] == 1.0 and res["layer_1_ties"] == 0.0  # context separates
  assert res["layer_1_answerable"] == 1.0
  # A sense with one example cannot be right under leave-one-out: it lowers layer_k, not the answerable score.
  lone = readers.read_wsd(write(tmp_path / "w1.tsv", wsd_tsv() + "bank\tnoun\tbank%tilt\t0\tbank the plane\n"))
  feats1 = features.target_features(emb, [r.tokens for r in lone], [r.token_index for r in lone])
  res1 = wsd.nearest_neighbour(lone, feats1)
  assert res1["n"] == 7 and res1["n_answerable"] == 6
  assert res1["layer_1"] == pytest.approx(6 / 7) and res1["layer_1_answerable"] == 1.0
  assert "answerable rows: trained" in report.table({"trained": res1, "untrained": res})
  # Centroids from the same rows: the contextual layer picks the right sense.
  cent = wsd.sense_centroids(rows, feats, rows, feats)
  assert cent["layer_1"] == 1.0 and cent["layer_0_ties"] == 1.0
  label, senses, coords = wsd.pca_example(rows, feats)
  assert label == "bank/noun" and coords.shape == (3, 6, 2)


# ---------------------------------------------------------------- probes


def _synthetic(rng, n, informative_layer=1, n_classes=4):
  y = rng.integers(0, n_classes, n)
  x = rng.normal(size=(n, 3, 12)).astype(np.float32)
  x[:, informative_layer] += 3.0 * rng.normal(size=(n_classes, 12))[y]
  return x, y


def test_probe_separable_high_and_random_near_chance():
  rng = np.random.default_rng(0)
  x, y = _synthetic(rng, 2400)
  res = probes.probe_all_layers(x[:1600], y[:1600], x[1600:], y[1600:], 4, config=FAST)
  assert res["layer_1"] > 0.95 and res["mix"] > 0.95
  assert res["layer_0"] < 0.4 and res["layer_2"] < 0.4
  # Mix weights concentrate on the informative layer.
  assert int(np.argmax(res["mix_weights"])) == 1 and res["mix_weights"][1] > 0.6
  assert abs(sum(res["mix_weights"]) - 1) < 1e-5
  y_rand = rng.integers(0, 2, 2400)
  res = probes.fit_probe(x[:1600], y_rand[:1600], x[1600:], y_rand[1600:], 2, mix=True,
                         config=FAST)
  assert 0.4 < res.accuracy < 0.6


def test_early_stopping_patience_ties_and_epochs_run():
  scores = [0.5, 0.7, 0.7, 0.6, 0.9]  # epoch 3 ties epoch 2: not an improvement
  improves = lambda record, best: best is None or record[1] > best[1]  # noqa: E731

  def epochs(patience, max_epochs=5):
    return early_stopping.run_epochs(lambda e: (e, scores[e - 1]), improves, max_epochs, patience)
  assert epochs(2) == ((2, 0.7), 4)  # stale after epochs 3 and 4
  assert epochs(3) == ((5, 0.9), 5)
  assert epochs(0) == ((1, 0.5), 1)  # 0: the first epoch only
  assert epochs(3, max_epochs=0) == (None, 0)
  kept = early_stopping.run_epochs(lambda e: (e, scores[e - 1]), improves, 2, 1, keep=list)
  assert kept == ([2, 0.7], 2)  # what `keep` made of the best record


def test_majority_baseline_and_perplexity_bars(tmp_path):
  assert probes.majority_accuracy(np.array([0, 1, 1]), np.array([1, 0, 1, 1])) == 0.75
  assert probes.majority_accuracy(np.array([0, 1, 1]), np.array([], int)) == 0.0
  one = {"ppl_forward": 30.5, "ppl_backward": 33.1, "ppl": 31.8, "unigram_ppl": 200.0, "n_tokens": 1000}
  fig = plots.perplexity_bars(None, one)
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["forward", "backward", "mean", "unigram"]
  fig = plots.perplexity_by_model(None, {"a": one, "b": dict(one, unigram_ppl=None)})
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b"]
  assert fig.axes[0].get_yscale() == "log"


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_run_all_writes_json_plots_report_and_caches(tmp_path):
  cfg = eval_cfg(tmp_path)
  loads = []
  lines = []
  results = tasks.run("all", cfg, fake_models(loads), echo=lines.append)
  out = cfg.output_dir
  assert "no text to score" in results["perplexity"]["skipped"]  # no workdir, no --text_file
  for task in ("wsd", "pos", "sentiment"):
    with open(os.path.join(out, f"{task}.json")) as f:
      data = json.load(f)
    for model in ("trained", "untrained"):
      scores = data[model]
      for key in ("layer_0", "layer_1", "layer_2", "mix_weights", "n"):
        assert key in scores, (task, model, key)
      for key in ("layer_0", "layer_1", "layer_2"):
        assert 0.0 <= scores[key] <= 1.0
      if task != "wsd":
        assert 0.0 <= scores["mix"] <= 1.0 and len(scores["mix_weights"]) == 3
    for plot in data["plots"]:
      with open(plot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  wsd_res = json.load(open(os.path.join(out, "wsd.json")))
  assert "layer_0_ties" in wsd_res["trained"] and "tie" in wsd_res["rule"]
  pos_res = json.load(open(os.path.join(out, "pos.json")))
  assert pos_res["trained"]["layer_0"] > 0.95  # tags are a function of the word
  sent_res = json.load(open(os.path.join(out, "sentiment.json")))
  assert sent_res["trained"]["layer_0"] > 0.85 and sent_res["trained"]["n"] == 100
  report = open(os.path.join(out, "report.md")).read()
  assert "## pos" in report and "](pos_layers.png)" in report and "wsd_pca.png" in report
  assert loads == [1] and any("layer_1" in line for line in lines)
  # Second run: features come from the cache, the embedder is never called.
  models = fake_models()()
  tasks.run("wsd", cfg, lambda: models, echo=lambda _: None)
  assert models.trained.calls == 0 and models.untrained.calls == 0
  assert any(n.startswith("wsd-trained-fake-") for n in os.listdir(os.path.join(out, "cache")))


def test_unknown_test_label_fails_before_loading_models(tmp_path):
  cfg = eval_cfg(tmp_path)
  cfg.sentiment_test_file = write(tmp_path / "bad.tsv", "1\tgood.\nneutral\tso so.\n")
  loads = []
  with pytest.raises(readers.InputError, match=r"bad\.tsv:2: unknown label 'neutral'"):
    tasks.run("sentiment", cfg, fake_models(loads))
  assert loads == []


def test_main_with_injected_embedder(tmp_path, parsed_flags):
  cfg = eval_cfg(tmp_path)
  parsed_flags("--task=pos", f"--output_dir={cfg.output_dir}",
               f"--train_file={cfg.pos_train_file}", f"--test_file={cfg.pos_test_file}",
               "--max_examples=60", "--probe_max_epochs=10")
  evaluate.main(["evaluate.py"], load_models=fake_models())
  data = json.load(open(os.path.join(cfg.output_dir, "pos.json")))
  assert data["data"]["train_sentences"] == 60 and data["probe_config"]["max_epochs"] == 10
  assert os.path.exists(os.path.join(cfg.output_dir, "pos_mix.png"))
  parsed_flags("--task=wsd", f"--options_file={tmp_path}/missing.json",
               f"--weight_file={tmp_path}/w.hdf5")
  with pytest.raises(SystemExit, match="missing.json: file not found"):
    evaluate.main(["evaluate.py"], load_models=fake_models())
  parsed_flags("--task=wsd")
  with pytest.raises(SystemExit, match="--output_dir is required"):
    evaluate.main(["evaluate.py"], load_models=fake_models())


@pytest.mark.slow
def test_cli_bad_input_exits_with_one_line(tmp_path):
  bad = write(tmp_path / "bad.conll", "the\tDT\ncat\tNN\tX\n")
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO_ROOT, "evaluate.py"), "--task=pos",
       f"--output_dir={tmp_path}/out", f"--train_file={bad}", f"--test_file={bad}"],
      capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
      env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0
  err = proc.stderr.strip().splitlines()
  assert len(err) == 1 and "bad.conll:2: expected 2 tab-separated" in err[0], proc.stderr


def test_plot_perplexity(tmp_path):
  metrics = [{"step": s, "train_loss": 5.0 - s / 100, "train_ppl_forward": 200 - s,
              "train_ppl_backward": 210 - s} for s in range(0, 100, 10)]
  metrics += [{"step": 50, "eval_ppl_forward": 150.0, "eval_ppl_backward": 160.0,
               "eval_ppl": 155.0}, {"step": 100, "eval_ppl_forward": 120.0,
                                    "eval_ppl_backward": 125.0, "eval_ppl": 122.5}]
  path = write(tmp_path / "metrics.jsonl", "\n".join(json.dumps(m) for m in metrics) + "\n")
  png = plots.save(plots.perplexity_curves(path), str(tmp_path / "ppl.png"))
  assert os.path.getsize(png) > 1000
  bad = write(tmp_path / "bad.jsonl", '{"step": 1}\nnot json\n')
  with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
    plots.perplexity_curves(bad)
