"""A long embedding job killed and resumed, and its memory against the input's size; prints one JSON object.

    python benchmarks/embed_resume.py [--preset=small] [--lines=20000] [--small_lines=2000]

All through the command (`python -m elmo_jax embed`, fresh processes, the persistent compilation cache
warmed first): random weights of the preset (speed does not depend on the values), the first --small_lines
lines of the corpus in data/, repeated to make --lines (see `write_inputs`). Measured:
  * `full`: an uninterrupted run over --lines (seconds, peak RSS of the process);
  * `small`: the same over --small_lines (peak RSS: memory must not grow with the input);
  * `killed` + `rerun`: a run `kill -9`ed once half the lines are in committed parts, then the same command
    again: the rerun's seconds and the share of the lines it embedded, against `full`; the rerun's file
    must hold the same datasets as the full run's (`identical`).
"""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

import h5py
import jax
import numpy as np

from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.embedding import job as embed_job
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.model import BiLM, BiLMConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "small", "options preset of the random model.")
flags.DEFINE_integer("lines", 20_000, "Lines of the long job.")
flags.DEFINE_integer("small_lines", 2_000, "Lines of the short job (memory comparison).")
flags.DEFINE_float("kill_at", 0.5, "Share of the lines committed when the job is killed.")
flags.DEFINE_string("corpus", os.path.join(REPO, "data", "pd-small", "train.txt.gz"),
                    "Raw text, one sentence per line (gzip).")


def write_inputs(tmp: str) -> dict[str, str]:
  """The first --small_lines non-empty corpus lines (Moses-tokenized) and --lines of them repeated.

  Repeated, so the long input holds the same sentence lengths as the short one: an XLA:CPU process keeps
  the temporaries of the largest batch shape it has run, so a longer input with a longer longest sentence
  needs more memory for that reason alone; this compares input size, not the longest sentence.
  """
  tokenize, lines = Tokenizer(), []
  with gzip.open(FLAGS.corpus, "rt", encoding="utf-8") as f:
    for line in f:
      if tokens := tokenize(line.strip()):
        lines.append(" ".join(tokens))
      if len(lines) == FLAGS.small_lines:
        break
  paths = {}
  for name, n in (("long", FLAGS.lines), ("short", FLAGS.small_lines)):
    paths[name] = os.path.join(tmp, f"{name}.txt")
    with open(paths[name], "w", encoding="utf-8") as f:
      f.writelines(lines[i % len(lines)] + "\n" for i in range(n))
  return paths


def write_model(tmp: str) -> list[str]:
  options = options_lib.validate(options_lib.preset(FLAGS.preset))
  dummy = np.zeros((1, 1, options["char_cnn"]["max_characters_per_token"]), np.int32)
  params = jax.jit(BiLM(BiLMConfig.from_options(options)).init)(jax.random.key(0), dummy)["params"]
  with open(os.path.join(tmp, "options.json"), "w") as f:
    json.dump(options, f)
  weights_lib.save_hdf5(os.path.join(tmp, "weights.hdf5"), jax.device_get(params), options)
  return [f"--options_file={tmp}/options.json", f"--weight_file={tmp}/weights.hdf5"]


def run(args: list[str], kill_when=None) -> dict:
  """One command; seconds, exit status and peak RSS (MB) of that process alone (wait4)."""
  start = time.perf_counter()
  proc = subprocess.Popen([sys.executable, "-m", "elmo_jax", "embed", *args, "--noprogress"], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  killed = False
  if kill_when is not None:
    while proc.poll() is None and not kill_when():
      time.sleep(0.05)
    if proc.poll() is None:
      proc.send_signal(signal.SIGKILL)
      killed = True
  _, status, usage = os.wait4(proc.pid, 0)
  stderr = proc.stderr.read().decode()
  return {"seconds": round(time.perf_counter() - start, 2), "status": os.waitstatus_to_exitcode(status),
          "killed": killed, "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "stderr_tail": stderr[-300:]}


def contents(path: str) -> dict:
  out = {}
  with h5py.File(path, "r") as f:
    f.visititems(lambda k, v: out.__setitem__(k, v[...]) if isinstance(v, h5py.Dataset) else None)
  return out


def main(argv) -> None:
  del argv
  result = {"preset": FLAGS.preset, "lines": FLAGS.lines, "small_lines": FLAGS.small_lines,
            "cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg()}
  with tempfile.TemporaryDirectory() as tmp:
    model, inputs = write_model(tmp), write_inputs(tmp)
    out = lambda name: f"--output_file={tmp}/{name}.hdf5"  # noqa: E731
    run(model + [f"--input_file={inputs['short']}", out("warm")])  # fills the persistent compilation cache
    result["full"] = run(model + [f"--input_file={inputs['long']}", out("full")])
    result["small"] = run(model + [f"--input_file={inputs['short']}", out("small")])
    job = embed_job.Job(f"{tmp}/resumed.hdf5")
    target = FLAGS.kill_at * FLAGS.lines
    result["killed"] = run(model + [f"--input_file={inputs['long']}", out("resumed")],
                           kill_when=lambda: job.done_counts()[0] >= target)
    done = job.done_counts()[0]
    result["killed"]["lines_committed"] = done
    result["rerun"] = run(model + [f"--input_file={inputs['long']}", out("resumed")])
    result["rerun"]["lines_embedded"] = FLAGS.lines - done
    result["rerun_share_of_full_time"] = round(result["rerun"]["seconds"] / result["full"]["seconds"], 3)
    result["rerun_share_of_lines"] = round((FLAGS.lines - done) / FLAGS.lines, 3)
    a, b = contents(f"{tmp}/full.hdf5"), contents(f"{tmp}/resumed.hdf5")
    result["identical"] = sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    result["rss_long_over_short"] = round(result["full"]["peak_rss_mb"] / result["small"]["peak_rss_mb"], 3)
  result["load_avg_end"] = os.getloadavg()
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  app.run(main)
