"""Packed rows, before and after, interleaved: the same measurements run by two checkouts of elmo_jax (this one and
another, e.g. a `git worktree` of the commit before), each in its own fresh process, alternating A B B A ... ;
prints one JSON object (and writes it with `--out`).

    git worktree add --detach /tmp/elmo_before 852a87e   # its venv: any env where `import elmo_jax` is that tree
    python benchmarks/packing_ab.py --before_python=/tmp/elmo_before/.venv/bin/python --rounds=3

Each process (`--worker`) loads a warm `Embedder` of random weights of `--preset`'s shape and times, on real
sentences from data/ (every token already in its table unless said):
  * `one`: one sentence a call (median ms; single-sentence latency must not move);
  * `mixed16`: 16 different consecutive sentences a call (median ms);
  * `sorted2000`, `unsorted2000`: `embed_sentences` of 2,000 sentences, in length order and as read (seconds);
  * `file2000`, `file64`: the embed command's `embed_file` on an unsorted file of 2,000 lines and of 64 lines
    (seconds, the job folder and HDF5 writing included).
`ratio`: after / before of each median over the rounds (< 1: after is faster).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from absl import app
from absl import flags

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FLAGS = flags.FLAGS
flags.DEFINE_string("before_python", None, "the Python whose `import elmo_jax` is the checkout to compare with.")
flags.DEFINE_string("after_python", sys.executable, "the Python of this checkout.")
flags.DEFINE_integer("rounds", 3, "A B rounds (the order alternates each round).")
flags.DEFINE_string("preset", "small", "options preset.")
flags.DEFINE_integer("calls", 60, "timed calls of `one` and `mixed16`.")
flags.DEFINE_string("out", None, "also write the JSON here.")
flags.DEFINE_bool("worker", False, "internal: run the measurements in this process and print them.")


def worker() -> dict[str, Any]:
  """One process's measurements (only APIs both checkouts have)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from bench_util import load_sentences  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding import writer  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.runtime import memory  # pylint: disable=g-import-not-at-top
  memory.reuse_freed_memory()
  emb = Embedder.random(options_lib.validate(options_lib.preset(FLAGS.preset)))
  sentences = load_sentences(os.path.join(_ROOT, "data", "pd-small", "train.txt.gz"), 4200, max_len=120)
  emb.embed_sentences(sentences)  # every token into the table, every shape run once

  def median_ms(calls) -> float:
    times = []
    for call in calls:
      start = time.perf_counter()
      call()
      times.append((time.perf_counter() - start) * 1e3)
    return round(statistics.median(times), 2)

  out = {"one": median_ms([lambda s=s: emb.embed_sentences([s]) for s in sentences[:FLAGS.calls]]),
         "mixed16": median_ms([lambda k=k: emb.embed_sentences(sentences[16 * k:16 * k + 16])
                               for k in range(FLAGS.calls)])}
  block = sentences[2000:4000]
  for name, batch in (("sorted2000", sorted(block, key=len)), ("unsorted2000", block)):
    start = time.perf_counter()
    emb.embed_sentences(batch)
    out[name] = round(time.perf_counter() - start, 3)
  with tempfile.TemporaryDirectory() as folder:
    for name, lines in (("file2000", block), ("file64", sentences[4000:4064])):
      path = os.path.join(folder, f"{name}.txt")
      with open(path, "w", encoding="utf-8") as f:
        f.write("".join(" ".join(s) + "\n" for s in lines))
      start = time.perf_counter()
      writer.embed_file(emb, path, os.path.join(folder, f"{name}.hdf5"), progress_every=None)
      out[name] = round(time.perf_counter() - start, 3)
  return out


def main(argv: Sequence[str]) -> None:
  del argv
  if FLAGS.worker:
    print(json.dumps(worker()))
    return
  if not FLAGS.before_python:
    raise app.UsageError("--before_python is required (the Python of the checkout to compare with)")
  sides = {"before": FLAGS.before_python, "after": FLAGS.after_python}
  runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
  load_before = os.getloadavg()
  for r in range(FLAGS.rounds):
    for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
      proc = subprocess.run([sides[name], os.path.abspath(__file__), "--worker", f"--preset={FLAGS.preset}",
                             f"--calls={FLAGS.calls}"], capture_output=True, text=True, cwd="/tmp", check=False)
      if proc.returncode:
        raise SystemExit(f"{name}: {proc.stderr[-3000:]}")
      runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
  medians = {name: {k: statistics.median(run[k] for run in runs[name]) for k in runs[name][0]} for name in runs}
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=_ROOT,
                          check=False).stdout.strip()
  result = {"preset": FLAGS.preset, "commit": commit, "rounds": FLAGS.rounds, "runs": runs, "median": medians,
            "ratio": {k: round(medians["after"][k] / medians["before"][k], 3) for k in medians["after"]},
            "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model()},
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}
  text = json.dumps(result, indent=1)
  print(text)
  if FLAGS.out:
    with open(FLAGS.out + ".tmp", "w") as f:
      f.write(text + "\n")
    os.replace(FLAGS.out + ".tmp", FLAGS.out)


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
  except OSError:
    return ""


if __name__ == "__main__":
  app.run(main)
