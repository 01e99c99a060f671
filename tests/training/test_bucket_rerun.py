"""A bucket run (`--workdir=gs://...`, on fake-gcs-server: tests/gcs_util.py) rerun and evaluated from an empty
local cache, as on a fresh machine, at every point of its life: killed before its first checkpoint, after
one, and after its only checkpoint was set aside as bad. The bucket holds everything each needs
(`run_layout.START_FILES`, `RUN_FILES`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import gcs_util
import launch_util
import tiny
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import START_FILES

pytestmark = pytest.mark.slow
gcs_server = gcs_util.gcs_server  # the fixture


def _evaluate(workdir: str, text: str, cache: str) -> subprocess.CompletedProcess:
  env = {**launch_util.env(), "ELMO_JAX_CACHE": cache}
  return subprocess.run([sys.executable, "evaluate.py", "--task=perplexity", f"--workdir={workdir}",
                         f"--text_file={text}", "--max_batches=2", "--noprogress"],
                        cwd=launch_util.REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)


def _baseline(url: str) -> list:
  """metrics.jsonl's step-0 records in the bucket (one per fresh start since the last rewind)."""
  text = storage.read_bytes(url + "/metrics.jsonl").decode()
  return [r for r in launch_util.parse_records(text) if r["step"] == 0]


@pytest.fixture(scope="module")
def life(gcs_server, tmp_path_factory):
  """One run's life, each start with its own empty cache (a fresh machine): killed at step 2 (no checkpoint);
  rerun to step 4 (checkpoint 4); rerun to 6 (resumes, checkpoint 6 alone: keep_checkpoints=1); checkpoint 6
  tampered; rerun (set aside, trains from scratch). Evaluated after each stage that has an export."""
  root = str(tmp_path_factory.mktemp("bucket_rerun"))
  seen: dict = {}
  with pytest.MonkeyPatch.context() as mp:
    for key, value in gcs_server.env.items():
      mp.setenv(key, value)
    url = gcs_server.new_bucket() + "/run"
    train = launch_util.write_corpus(os.path.join(root, "train.txt"))
    valid = launch_util.write_corpus(os.path.join(root, "valid.txt"), n_lines=40, seed=1)
    config = tiny.write_train_config(os.path.join(root, "tiny.py"), train, valid, **{
        "options.char_cnn.n_highway": 1, "data.vocab_max_size": 500, "eval_every_steps": 10_000,
        "eval_max_batches": 2, "n_negative_samples": 0, "num_train_steps": 8, "checkpoint_every_steps": 4,
        "log_every_steps": 2, "keep_checkpoints": 1})
    starts = iter(range(100))

    def start(*flags: str, signal_at: str | None = None) -> tuple[int, str]:
      n = next(starts)
      mp.setenv("ELMO_JAX_CACHE", os.path.join(root, f"cache{n}"))  # launch_util.env copies os.environ
      log = os.path.join(root, f"train{n}.log")
      proc = launch_util.launch(url, config, *flags, log=log, **({"signal_at": signal_at} if signal_at else {}))
      return launch_util.wait([proc], 300)[0], launch_util.read(log)

    seen["killed"] = start(signal_at="2:KILL")
    seen["objects_killed"] = storage.listdir(url)
    seen["eval_none"] = _evaluate(url, valid, os.path.join(root, "eval-cache0"))
    seen["first"] = start("--config.num_train_steps=4")
    seen["baseline_first"] = _baseline(url)
    seen["eval_first"] = _evaluate(url, valid, os.path.join(root, "eval-cache1"))
    seen["resumed"] = start("--config.num_train_steps=6")
    seen["checkpoints_resumed"] = storage.listdir(url + "/checkpoints")
    objects = storage.list_objects(url + "/checkpoints/6")  # pylint: disable=protected-access
    name = max((rel for rel in objects if rel.startswith("state/")), key=lambda rel: objects[rel]["size"])
    data = bytearray(storage.read_bytes(f"{url}/checkpoints/6/{name}"))
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    storage.write_bytes(f"{url}/checkpoints/6/{name}", bytes(data))
    seen["quarantined"] = start("--config.num_train_steps=6")
    seen["baseline_quarantined"] = _baseline(url)
    seen["eval_quarantined"] = _evaluate(url, valid, os.path.join(root, "eval-cache2"))
    seen["url"] = url
    yield seen  # the clients still pointed at the server while the tests read the bucket


def _no_traceback(started: tuple[int, str], code: int = 0) -> str:
  rc, log = started
  assert rc == code and "Traceback" not in log, log[-3000:]
  return log


def _unigram(evaluated: subprocess.CompletedProcess, url: str) -> float:
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  result = json.loads(storage.read_bytes(url + "/eval/perplexity.json"))
  assert "unigram_note" not in result, result
  assert isinstance(result["unigram_ppl"], float) and result["unigram_ppl"] > 1
  return result["unigram_ppl"]


def test_rerun_of_a_bucket_run_killed_before_its_first_checkpoint(life):
  _no_traceback(life["killed"], -signal.SIGKILL)
  assert set(START_FILES) <= set(life["objects_killed"]), life["objects_killed"]
  # Nothing to evaluate yet: one line naming the bucket run, not its local copy.
  assert life["eval_none"].returncode == 1 and "Traceback" not in life["eval_none"].stderr, life["eval_none"].stderr
  assert life["eval_none"].stderr.strip().splitlines()[-1] == (
      f"evaluate.py: error: --workdir={life['url']} holds no export/ yet: a run exports its model at every "
      "checkpoint save; evaluate it after its first one")
  log = _no_traceback(life["first"])
  assert "resumed from" not in log and "unigram baseline on the eval split: ppl" in log
  assert [r["unigram_ppl"] > 1 for r in life["baseline_first"]] == [True]  # the killed start's record rewound
  _unigram(life["eval_first"], life["url"])


def test_resume_of_a_bucket_run_after_a_checkpoint_from_an_empty_cache(life):
  log = _no_traceback(life["resumed"])
  assert "resumed from step 4" in log and "done: step 6" in log
  assert life["checkpoints_resumed"] == ["6", "checksums"]


def test_rerun_of_a_bucket_run_whose_only_checkpoint_was_set_aside(life):
  log = _no_traceback(life["quarantined"])
  assert "checkpoint step 6 is unusable" in log and "resumed from" not in log and "done: step 6" in log
  assert "unigram baseline on the eval split: ppl" in log
  assert len(life["baseline_quarantined"]) == 1 and life["baseline_quarantined"][0]["unigram_ppl"] > 1
  first = life["baseline_first"][0]["unigram_ppl"]
  assert life["baseline_quarantined"][0]["unigram_ppl"] == first  # the same vocabulary, the same eval split
  assert _unigram(life["eval_quarantined"], life["url"]) > 1
