"""First and second run of the embed CLI with the persistent compilation cache, and its peak RSS next to
AllenNLP's on the same sentences; prints one JSON object.

    python benchmarks/embed_cli_cold_start.py [--preset=small] [--num_sentences=2000] [--allennlp_path=/tmp/allennlp_pkg]

Writes random weights of the preset and the first --num_sentences lines of the corpus in data/ to a temp
dir, then runs `python -m elmo_jax embed` there three times as a new user would: with an empty cache
(first run), again (second run: compiled shapes come from the cache), and with --nocompilation_cache.
Each run reports wall seconds and the seconds JAX spent tracing, lowering and compiling (or loading from
the cache), measured in the child through jax.monitoring, and `peak_rss_mb`, the peak resident memory of
that process (`VmHWM` of /proc/self/status, read by the child as it ends: a child's `ru_maxrss` counts its
parent's peak too, the memory it was forked from).

`allennlp` (where `--allennlp_path` holds allennlp 2.10.1: benchmarks/allennlp_baseline.py): one process embeds
the same lines with AllenNLP's `Elmo` on the same weights as a user's loop does: batches of 64 lines in file
order, `batch_to_ids`, the biLM under `torch.no_grad`, every layer of each sentence written to an hdf5 dataset
named by its line (the layout of the embed command's default `--all` and AllenNLP's old `elmo` command);
`peak_rss_mb` of that process, and `rss_over_allennlp`: each of our runs' peak over it.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app
from absl import flags

from bench_util import memory_mb  # pylint: disable=g-bad-import-order

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
_CORPUS = os.path.join(_ROOT, "data", "pd-small", "train.txt.gz")
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Only in the parent: the child defines the CLI's own flags."""
  flags.DEFINE_string("preset", "small", "options preset.")
  flags.DEFINE_integer("num_sentences", 2000, "Lines of the corpus to embed.")
  flags.DEFINE_string("corpus", _CORPUS, "gzip (or plain) text, one sentence per line.")
  flags.DEFINE_integer("batch_size", 0, "--batch_size of the CLI (0: its default).")
  flags.DEFINE_string("allennlp_path", "/tmp/allennlp_pkg", "pip --target folder holding allennlp 2.10.1 "
                      "(benchmarks/allennlp_baseline.py); empty or missing: no AllenNLP run.")


def child(argv: list[str]) -> None:
  """Runs the CLI in this process as `elmo-jax embed` does (`cli.run_main`: glibc's memory setting first) with a
  listener on JAX's compile events; prints their total last."""
  import jax  # pylint: disable=g-import-not-at-top
  from elmo_jax import cli  # pylint: disable=g-import-not-at-top
  from elmo_jax.cli import embed  # pylint: disable=g-import-not-at-top
  total = {e.rsplit("/", 1)[-1]: 0.0 for e in _COMPILE_EVENTS}

  def listen(event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event in _COMPILE_EVENTS:
      total[event.rsplit("/", 1)[-1]] += duration
  jax.monitoring.register_event_duration_secs_listener(listen)
  sys.argv = argv
  try:
    cli.run_main(embed.main, embed.define_flags)
  finally:
    print(json.dumps({"peak_rss_mb": memory_mb().get("hwm"), "compile_s": round(sum(total.values()), 2),
                      "compile_split_s": {k: round(v, 2) for k, v in total.items()}}), file=sys.stderr, flush=True)


def allennlp_child(path: str, options_file: str, weight_file: str, input_file: str, output_file: str) -> None:
  """AllenNLP's `Elmo` over `input_file` in batches of 64 lines, every layer of each line into `output_file`."""
  import h5py  # pylint: disable=g-import-not-at-top
  from allennlp_baseline import AllenNLPElmo  # pylint: disable=g-import-not-at-top
  elmo = AllenNLPElmo(path, options_file, weight_file)
  with open(input_file, encoding="utf-8") as f:
    lines = [line.split() for line in f]
  with h5py.File(output_file, "w") as out:
    for start in range(0, len(lines), 64):
      for i, layers in enumerate(elmo.layers(lines[start:start + 64])):  # [n_layers + 1, n_tokens, 2P]
        out.create_dataset(str(start + i), data=layers)
  print(json.dumps({"peak_rss_mb": memory_mb().get("hwm")}), file=sys.stderr, flush=True)


def run(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
  """One child: its wall seconds and the JSON object of its last stderr line; raises if it failed."""
  start = time.perf_counter()
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f"{cmd[:3]} failed:\n{proc.stderr[-3000:]}")
  return {"wall_s": round(time.perf_counter() - start, 2), **json.loads(proc.stderr.strip().splitlines()[-1])}


def main(argv: list[str]) -> None:
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import weights as weights_lib  # pylint: disable=g-import-not-at-top
  result = {"preset": FLAGS.preset, "load_avg_start": os.getloadavg()}
  with tempfile.TemporaryDirectory() as tmp:
    options = options_lib.preset(FLAGS.preset)
    emb = Embedder.random(options, compilation_cache=False)
    weights_lib.save_hdf5(os.path.join(tmp, "weights.hdf5"), emb.params, options)
    with open(os.path.join(tmp, "options.json"), "w") as f:
      json.dump(options, f)
    opener = gzip.open if FLAGS.corpus.endswith(".gz") else open
    with opener(FLAGS.corpus, "rt", encoding="utf-8") as f, open(os.path.join(tmp, "in.txt"), "w") as out:
      lines = [line for _, line in zip(range(FLAGS.num_sentences), f)]
      out.writelines(lines)
    result["num_sentences"] = len(lines)
    result["num_tokens"] = int(np.sum([len(line.split()) for line in lines]))
    env = {**os.environ, "ELMO_JAX_CACHE": os.path.join(tmp, "cache")}
    env["PYTHONPATH"] = os.pathsep.join([_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--", f"--options_file={tmp}/options.json",
           f"--weight_file={tmp}/weights.hdf5", f"--input_file={tmp}/in.txt", f"--output_file={tmp}/out.hdf5",
           "--progress_every=600"] + ([f"--batch_size={FLAGS.batch_size}"] if FLAGS.batch_size else [])
    for name, extra in (("first_run", []), ("second_run", []), ("no_cache", ["--nocompilation_cache"])):
      result[name] = run(cmd + extra, env)
      print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    if FLAGS.allennlp_path and os.path.isdir(FLAGS.allennlp_path):
      out = run([sys.executable, os.path.abspath(__file__), "--allennlp", FLAGS.allennlp_path, f"{tmp}/options.json",
                 f"{tmp}/weights.hdf5", f"{tmp}/in.txt", f"{tmp}/allennlp.hdf5"], env)
      result["allennlp"] = {"wall_s": out["wall_s"], "peak_rss_mb": out["peak_rss_mb"],
                            "what": "allennlp==2.10.1 Elmo, batches of 64 in file order, all layers to hdf5"}
      result["rss_over_allennlp"] = {name: round(result[name]["peak_rss_mb"] / out["peak_rss_mb"], 3)
                                     for name in ("first_run", "second_run", "no_cache")}
    cache = env["ELMO_JAX_CACHE"]
    result["cache_mb"] = round(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache)
                                   for f in fs) / 2**20, 1)
  result["load_avg_end"] = os.getloadavg()
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--child":
    child([sys.argv[0]] + sys.argv[3:])
  elif len(sys.argv) > 1 and sys.argv[1] == "--allennlp":
    allennlp_child(*sys.argv[2:7])
  else:
    define_flags()
    app.run(main)
