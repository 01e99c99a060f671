"""`evaluate.py --task=all` on a fresh clone: runs what has data, skips the rest in one line each, checks
every input before any work, writes report.md; --probe_data_dir supplies the probe sets."""
from __future__ import annotations

import os
import shutil

import pytest

import evaluate
from elmo_jax.evaluation import probes, readers, tasks
from eval_util import eval_cfg, fake_models, write


@pytest.mark.slow
def test_all_runs_what_has_data_and_skips_the_rest_in_one_line_each(tmp_path):
  cfg = eval_cfg(tmp_path, max_examples=30)
  cfg.probe = probes.ProbeConfig(max_epochs=3, patience=1)
  cfg.wsd_file = cfg.sentiment_train_file = cfg.sentiment_test_file = None
  lines, started = [], []
  results = tasks.run("all", cfg, fake_models(), echo=lines.append, on_start=lambda: started.append(1))
  assert "trained" in results["pos"] and started == [1]
  skips = {line.split(":")[0]: line for line in lines if ": skipped (" in line}
  assert set(skips) == {"perplexity", "wsd", "sentiment"}
  assert "--text_file" in skips["perplexity"] and "--tfds_name=lm1b" in skips["perplexity"]
  assert "--wsd_file" in skips["wsd"] and "--probe_data_dir" in skips["wsd"]
  assert "tfds:glue/sst2:train" in skips["sentiment"]
  assert all("\n" not in line for line in skips.values())
  report = open(os.path.join(cfg.output_dir, "report.md")).read()
  assert "Skipped: no data; pass --wsd_file" in report and not os.path.exists(
      os.path.join(cfg.output_dir, "wsd.json"))


def test_all_checks_every_input_before_any_work(tmp_path):
  cfg = eval_cfg(tmp_path)
  cfg.sentiment_test_file = write(tmp_path / "bad.tsv", "1\tgood .\nneutral\tso so .\n")
  loads, started = [], []
  with pytest.raises(readers.InputError, match=r"bad\.tsv:2: unknown label 'neutral'"):
    tasks.run("all", cfg, fake_models(loads), on_start=lambda: started.append(1))
  assert loads == [] and started == []
  assert not os.path.exists(cfg.output_dir)  # wsd and pos (which come first) did not run either


def test_all_without_any_data_exits_non_zero(tmp_path, parsed_flags):
  parsed_flags("--task=all", f"--output_dir={tmp_path}/out")
  with pytest.raises(SystemExit, match="no task has data to run"):
    evaluate.main(["evaluate.py"], load_models=fake_models())
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.slow
def test_probe_data_dir_supplies_the_probe_sets(tmp_path, parsed_flags):
  cfg = eval_cfg(tmp_path)
  root = tmp_path / "probes"
  for key, rel in tasks.PROBE_FILES.items():
    if key.startswith("pos_"):
      os.makedirs(root / os.path.dirname(rel), exist_ok=True)
      shutil.copy(getattr(cfg, key), root / rel)
  parsed_flags("--task=all", f"--output_dir={tmp_path}/out", f"--probe_data_dir={root}",
               "--max_examples=40", "--probe_max_epochs=5", "--noprogress")
  evaluate.main(["evaluate.py"], load_models=fake_models())
  assert os.path.exists(tmp_path / "out" / "pos.json") and os.path.exists(tmp_path / "out" / "report.md")
  parsed_flags("--task=all", f"--output_dir={tmp_path}/out", f"--probe_data_dir={tmp_path}/nope")
  with pytest.raises(SystemExit, match="nope: not a directory"):
    evaluate.main(["evaluate.py"], load_models=fake_models())
