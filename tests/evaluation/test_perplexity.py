"""Tests of `evaluate.py --task=perplexity` (elmo_jax/evaluation/perplexity.py) on a tiny trained run."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import evaluate
from elmo_jax.data import Tokenizer, Vocab, make_lm_iterator
from elmo_jax.evaluation import perplexity, tasks
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.training import lm_eval

from tiny import train_tiny
from paths import REPO_ROOT


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  return train_tiny(str(tmp_path_factory.mktemp("tiny_run")))


def _last_eval(workdir: str) -> dict:
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]
  return [r for r in rows if "eval_ppl" in r][-1]


@pytest.mark.slow
def test_matches_trainer_eval_and_writes_json_and_plots(tiny_run, tmp_path, parsed_flags):
  out = str(tmp_path / "out")
  parsed_flags("--task=perplexity", f"--workdir={tiny_run}", f"--output_dir={out}")
  evaluate.main(["evaluate.py"])
  result = json.load(open(os.path.join(out, "perplexity.json")))
  for key in ("ppl_forward", "ppl_backward", "ppl", "oov_rate", "n_tokens", "unigram_ppl", "convention",
              "data", "model", "plots"):
    assert key in result, key
  assert result["convention"] == lm_eval.CONVENTION
  # Default text, batch and unroll come from the run's config: the trainer's last eval, recomputed.
  expected = _last_eval(tiny_run)
  assert result["n_tokens"] == expected["eval_tokens"]
  for ours, theirs in (("ppl", "eval_ppl"), ("ppl_forward", "eval_ppl_forward"),
                       ("ppl_backward", "eval_ppl_backward")):
    assert result[ours] == pytest.approx(expected[theirs], rel=1e-4)
  assert result["ppl"] == pytest.approx(math.sqrt(result["ppl_forward"] * result["ppl_backward"]))
  # Unigram on the model's forward targets == the trainer's step-0 baseline row over the same file.
  rows = [json.loads(line) for line in open(os.path.join(tiny_run, "metrics.jsonl"))]
  base = [r for r in rows if "unigram_ppl" in r]
  assert len(base) == 1 and base[0]["step"] == 0
  assert result["unigram_ppl"] == pytest.approx(base[0]["unigram_ppl"], rel=1e-9)
  assert result["oov_rate"] == pytest.approx(base[0]["oov_rate"])
  names = sorted(os.path.basename(p) for p in result["plots"])
  assert names == ["perplexity_bars.png", "perplexity_curves.png"]
  assert all(os.path.getsize(p) > 1000 for p in result["plots"])
  # Explicit files without counts next to the vocab: same model numbers, unigram null with a note.
  export = os.path.join(tiny_run, "export")
  parsed_flags("--task=perplexity", f"--options_file={export}/options.json",
               f"--weight_file={export}/weights.hdf5", f"--text_file={tiny_run}/data/valid.txt",
               f"--output_dir={out}/files", "--batch_size=4", "--unroll_steps=5", "--max_batches=2")
  evaluate.main(["evaluate.py"])
  files = json.load(open(os.path.join(out, "files", "perplexity.json")))
  assert files["unigram_ppl"] is None
  assert files["unigram_note"].startswith(f"no vocab_counts.tsv next to the vocabulary {export}/vocab.txt: ")
  assert files["n_tokens"] == 2 * 4 * 5 and files["data"]["max_batches"] == 2
  assert [os.path.basename(p) for p in files["plots"]] == ["perplexity_bars.png"]


def test_unigram_by_hand(tmp_path):
  vocab = Vocab(["<S>", "</S>", "<UNK>", "a", "b"], counts=[0, 2, 1, 3, 2])
  lines = ["a b", "a c"]
  batches = make_lm_iterator(lines, vocab, Tokenizer(pretokenized=True), batch_size=1, unroll_steps=4,
                             seed=0, shuffle=False, num_epochs=1, process_index=0, process_count=1)
  tally = lm_eval.UnigramTally(batches, vocab)
  assert len(list(tally)) == 2
  # Forward targets: a b </S> a <UNK> </S>; total count 8.
  probs = [3 / 8, 2 / 8, 2 / 8, 3 / 8, 1 / 8, 2 / 8]
  expected = math.exp(-np.mean(np.log(probs)))
  assert math.exp(tally.nll / tally.targets) == pytest.approx(expected, rel=1e-12)
  assert (tally.oov, tally.words) == (1, 4)
  assert tally.result() == {"unigram_ppl": pytest.approx(expected, rel=1e-12), "oov_rate": 0.25, "n_words": 4}
  again = make_lm_iterator(lines, vocab, Tokenizer(pretokenized=True), batch_size=2, unroll_steps=3,
                           seed=0, shuffle=False, num_epochs=1, process_index=0, process_count=1)
  assert lm_eval.unigram_baseline(vocab, again)["unigram_ppl"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
def test_bad_inputs_exit_with_one_line(tiny_run, tmp_path, parsed_flags):
  export = os.path.join(tiny_run, "export")
  options = options_lib.load(os.path.join(export, "options.json"))
  loaded = weights_lib.load_hdf5(os.path.join(export, "weights.hdf5"), options)
  bare = str(tmp_path / "bare.hdf5")
  weights_lib.save_hdf5(bare, loaded["params"], options)  # like original ELMo files: no softmax
  text = os.path.join(tiny_run, "data", "valid.txt")
  common = [f"--options_file={export}/options.json", f"--output_dir={tmp_path}/out", f"--text_file={text}"]
  cases = [
      ([f"--weight_file={bare}", f"--vocab_file={tiny_run}/vocab.txt"], "has no softmax"),
      ([f"--weight_file={export}/weights.hdf5", f"--vocab_file={tmp_path}/nope.txt"], "nope.txt: file not found"),
  ]
  short = tmp_path / "short" / "vocab.txt"
  short.parent.mkdir()
  short.write_text("<S>\n</S>\n<UNK>\nthe\n")
  cases.append(([f"--weight_file={export}/weights.hdf5", f"--vocab_file={short}"], "4 tokens but the softmax"))
  for extra, message in cases:
    parsed_flags("--task=perplexity", *common, *extra)
    with pytest.raises(SystemExit, match=message):
      evaluate.main(["evaluate.py"])
  parsed_flags("--task=perplexity", f"--workdir={tiny_run}", f"--output_dir={tmp_path}/out",
               f"--text_file={tmp_path}/missing.txt")
  with pytest.raises(SystemExit, match="missing.txt"):
    evaluate.main(["evaluate.py"])
  # The real CLI: non-zero exit and exactly one line on stderr.
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO_ROOT, "evaluate.py"), "--task=perplexity", *common,
       f"--weight_file={bare}", f"--vocab_file={tiny_run}/vocab.txt"],
      capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
      env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0
  err = [line for line in proc.stderr.splitlines() if line.strip() and "xla_bridge" not in line]
  assert len(err) == 1 and "has no softmax" in err[0], proc.stderr


def test_without_text_all_skips_and_perplexity_exits(tmp_path, parsed_flags):
  cfg = tasks.EvalConfig(output_dir=str(tmp_path))
  cfg.perplexity = perplexity.PerplexityConfig(options_file="o.json", weight_file="w.hdf5")
  with pytest.raises(tasks.TaskUnavailable, match="--text_file"):
    tasks.read_perplexity(cfg)
  parsed_flags("--task=perplexity", f"--output_dir={tmp_path}/out")
  with pytest.raises(SystemExit, match="no text to score"):
    evaluate.main(["evaluate.py"])


@pytest.mark.slow
def test_prepared_dir_scores_like_its_text(tiny_run, tmp_path, parsed_flags):
  from elmo_jax.data.prepare import prepare  # pylint: disable=g-import-not-at-top
  text = f"{tiny_run}/data/valid.txt"
  prepare(str(tmp_path / "prep"), [text], log_line=lambda _: None)
  results = {}
  for name, source in (("text", text), ("prepared", str(tmp_path / "prep"))):
    parsed_flags("--task=perplexity", f"--workdir={tiny_run}", f"--text_file={source}",
                 f"--output_dir={tmp_path}/{name}")
    evaluate.main(["evaluate.py"])
    results[name] = json.load(open(os.path.join(tmp_path, name, "perplexity.json")))
  for key in ("ppl_forward", "ppl_backward", "ppl", "n_tokens", "unigram_ppl", "oov_rate", "n_sentences"):
    assert results["prepared"][key] == pytest.approx(results["text"][key], rel=1e-6), key


@pytest.mark.slow
def test_text_that_is_all_oov_gets_a_warning_with_the_rate(tiny_run, tmp_path, parsed_flags, capsys):
  text = tmp_path / "alien.txt"
  text.write_text("zzqx vvbn kklo\nqqpp wwee\n" * 20)
  parsed_flags("--task=perplexity", f"--workdir={tiny_run}", f"--output_dir={tmp_path}/out",
               f"--text_file={text}", "--max_batches=2")
  evaluate.main(["evaluate.py"])
  result = json.load(open(os.path.join(tmp_path, "out", "perplexity.json")))
  assert result["oov_rate"] == 1.0 and result["warning"].startswith("100% of the words are out of")
  assert "WARNING: 100% of the words are out of the model's vocabulary" in capsys.readouterr().out
  parsed_flags("--task=perplexity", f"--workdir={tiny_run}", f"--output_dir={tmp_path}/ok", "--max_batches=2")
  evaluate.main(["evaluate.py"])
  assert "warning" not in json.load(open(os.path.join(tmp_path, "ok", "perplexity.json")))


def test_an_efml_style_run_is_named_not_its_missing_options_json(tmp_path):
  """Perplexity of an EFML-style run said export/options.json was missing: its export is an EFML folder."""
  for name in ("config.json", "encoder.pkl", "token_embedder.pkl", "char.dic"):
    os.makedirs(tmp_path / "run" / "export", exist_ok=True)
    (tmp_path / "run" / "export" / name).write_text("{}")
  (tmp_path / "run" / "config.json").write_text(json.dumps({"data": {"eval_files": ""}}))
  (tmp_path / "t.txt").write_text("the cat .\n")
  with pytest.raises(perplexity.NoSoftmax) as e:
    perplexity.check(perplexity.PerplexityConfig(text_file=str(tmp_path / "t.txt")), str(tmp_path / "run"))
  message = str(e.value)
  assert message.startswith(f"{tmp_path / 'run'}: an ELMoForManyLangs-style run, whose export/ is an EFML folder")
  assert "options.json" not in message.replace("config.json", "") and "metrics.jsonl" in message, message
