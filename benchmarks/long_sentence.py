"""Long sentences through a warm Embedder: each length embedded whole, no compile after load; prints one JSON object.

    python benchmarks/long_sentence.py [--preset=small] [--lengths=10000,100000]

Random weights of the preset (or `--options_file`), loaded warm (`Embedder(warm=True)`: every program compiled
at load), then one sentence of each length, built by joining the corpus' lines in order and cut to the length,
embedded with `embed_sentences` (lengths in increasing order, in this one process). A sentence past the longest
time bucket runs in fixed stretches (`elmo_jax/embedding/long_sentence.py`), so memory grows with its length only
through its positions on the host and its layers `[n_layers + 1, n_tokens, 2P]`.

Per length: `seconds` of the call, `compiles` during it (`CompileCounter`: traces and backend compiles, both 0),
`layers_mb` (the output's size), `rss_mb` (the process's resident memory after the call, the output still held)
and `peak_rss_mb` (the process's peak so far, `VmHWM`: it only grows, so each length's includes the shorter
ones' and the load's).
Also `rss_after_load_mb` and `peak_rss_after_load_mb`. The script exits 1 if any call compiled.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import time
from typing import Any

from absl import app
from absl import flags

from bench_util import memory_mb  # pylint: disable=g-bad-import-order

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "small", "options preset (small | medium | original).")
flags.DEFINE_string("options_file", None, "an options.json instead of the preset (e.g. a tiny smoke test).")
flags.DEFINE_list("lengths", ["10000", "100000"], "tokens per sentence, one sentence each.")
flags.DEFINE_string("corpus", os.path.join(_ROOT, "data", "pd-small", "train.txt.gz"),
                    "gzip (or plain) text, one whitespace-tokenized sentence per line.")


def long_sentence(path: str, n: int) -> list[str]:
  """The first `n` tokens of `path`'s lines joined in order (the file read again from the top if it is short)."""
  opener = gzip.open if path.endswith(".gz") else open
  out: list[str] = []
  while len(out) < n:
    before = len(out)
    with opener(path, "rt", encoding="utf-8") as f:
      for line in f:
        out.extend(line.split())
        if len(out) >= n:
          break
    if len(out) == before:
      raise ValueError(f"{path}: no tokens")
  return out[:n]


def main(argv: list[str]) -> None:
  del argv
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.runtime.compile_count import CompileCounter  # pylint: disable=g-import-not-at-top
  options = options_lib.load(FLAGS.options_file) if FLAGS.options_file else options_lib.preset(FLAGS.preset)
  start = time.perf_counter()
  emb = Embedder.random(options, warm=True)
  result: dict[str, Any] = {"preset": "custom" if FLAGS.options_file else FLAGS.preset,
                            "load_s": round(time.perf_counter() - start, 2),
                            "rss_after_load_mb": memory_mb().get("rss"),
                            "peak_rss_after_load_mb": memory_mb().get("hwm"), "lengths": []}
  for n in sorted(map(int, FLAGS.lengths)):
    sentence = long_sentence(FLAGS.corpus, n)
    with CompileCounter() as compiles:
      start = time.perf_counter()
      layers = emb.embed_sentences([sentence])[0]  # [n_layers + 1, n, 2P]
      seconds = time.perf_counter() - start
    assert layers.shape[1] == n, layers.shape
    result["lengths"].append({"length": n, "seconds": round(seconds, 2), "compiles": compiles.as_dict(),
                              "layers_mb": round(layers.nbytes / 2**20, 1), "rss_mb": memory_mb().get("rss"),
                              "peak_rss_mb": memory_mb().get("hwm")})
    del layers
    print(json.dumps(result["lengths"][-1]), file=sys.stderr, flush=True)
  print(json.dumps(result, indent=1))
  if any(r["compiles"]["traces"] or r["compiles"]["compiles"] for r in result["lengths"]):
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
