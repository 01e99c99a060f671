"""Batch-1 latency of the portable models next to the warm Embedder; prints one JSON object.

    python benchmarks/portable_latency.py [--preset=small] [--calls=300] [--warmup=30]

Random weights of the preset's released shape (latency does not depend on the values; `--options_file` for
another shape), real sentences from data/pd-small, one sentence a call, the three interleaved call by call (which
goes first rotates):
  * `embedder`: a warm `Embedder` (batch_size=1: the one-row programs a single-sentence call runs),
    `embed_sentences([s])`;
  * `stablehlo`: the `jax.export` artifact (`elmo-jax convert --format=stablehlo`) read back by
    `stablehlo.load_exported`, the char ids of `batch_to_ids` padded to the Embedder's warm time buckets, each
    bucket compiled before the clock (a symbolic shape still compiles once per concrete shape);
  * `onnx`: `model.onnx` in onnxruntime (CPU provider, its default threads) through `examples/onnx_embed.py`'s
    `embed` (tokenizer.json's ids, then the session).
Each: `ms` p50/p95/max/mean (bench_util.stats) over --calls calls after --warmup, and `p50_over_embedder`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from typing import Any, Callable

from absl import app
from absl import flags

from bench_util import clock, load_sentences, stats

import numpy as np

FLAGS = flags.FLAGS
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
flags.DEFINE_string("preset", "small", "options preset (small | medium | original).")
flags.DEFINE_string("options_file", None, "an options.json instead of the preset (e.g. a tiny smoke test).")
flags.DEFINE_integer("calls", 300, "timed calls per model.")
flags.DEFINE_integer("warmup", 30, "untimed calls first.")
flags.DEFINE_string("corpus", os.path.join(_ROOT, "data", "pd-small", "train.txt.gz"),
                    "gzip (or plain) text, one whitespace-tokenized sentence per line.")


def _example() -> Any:
  """examples/onnx_embed.py as a module (the runtime side a user runs)."""
  spec = importlib.util.spec_from_file_location("onnx_embed", os.path.join(_ROOT, "examples", "onnx_embed.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def runners(options: dict[str, Any], folder: str) -> dict[str, Callable[[list[str]], Any]]:
  """name -> one sentence's call, each ready (compiled, sessions open) before it returns."""
  import jax  # pylint: disable=g-import-not-at-top
  from elmo_jax.data import chars  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.host_batch import WARM_TIME_BUCKETS, bucket  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import onnx_export, stablehlo  # pylint: disable=g-import-not-at-top
  emb = Embedder.random(options, seed=0, warm=True, batch_size=1)
  params = jax.tree_util.tree_map(np.asarray, emb.params)
  for name, write in (("stablehlo", lambda d: stablehlo.write(d, options, params)),
                      ("onnx", lambda d: onnx_export.write(d, options, params))):
    os.makedirs(os.path.join(folder, name))
    write(os.path.join(folder, name))
  exported = stablehlo.load_exported(os.path.join(folder, "stablehlo"))
  width = emb.config.token_width
  for t in WARM_TIME_BUCKETS:
    exported(np.zeros((1, t, width), np.int32))
  example = _example()
  session, tok = example.load(os.path.join(folder, "onnx"))
  pad = lambda s: bucket(len(s), WARM_TIME_BUCKETS)  # noqa: E731
  return {
      "embedder": lambda s: emb.embed_sentences([s]),
      "stablehlo": lambda s: exported(chars.batch_to_ids([s], max_chars=width, pad_to=pad(s))),
      "onnx": lambda s: example.embed(session, tok, [s]),
  }


def measure(options: dict[str, Any]) -> dict[str, Any]:
  sentences = load_sentences(FLAGS.corpus, FLAGS.warmup + FLAGS.calls, max_len=128)
  with tempfile.TemporaryDirectory() as folder:
    run = runners(options, folder)
    names = list(run)
    for s in sentences[:FLAGS.warmup]:
      for name in names:
        run[name](s)
    ms: dict[str, list[float]] = {name: [] for name in names}
    for k, s in enumerate(sentences[FLAGS.warmup:]):
      for name in names[k % 3:] + names[:k % 3]:
        ms[name].append(clock(lambda: run[name](s)))  # pylint: disable=cell-var-from-loop
  out = {name: {"ms": stats(v)} for name, v in ms.items()}
  for name in names[1:]:
    out[name]["p50_over_embedder"] = round(out[name]["ms"]["p50"] / out["embedder"]["ms"]["p50"], 3)
  out["sentences"] = {"n": len(sentences) - FLAGS.warmup,
                      "mean_tokens": round(float(np.mean([len(s) for s in sentences[FLAGS.warmup:]])), 1)}
  return out


def main(argv: list[str]) -> None:
  del argv
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  import onnxruntime  # pylint: disable=g-import-not-at-top
  if FLAGS.options_file:
    options, name = options_lib.load(FLAGS.options_file), "custom"
  else:
    options, name = options_lib.validate(options_lib.preset(FLAGS.preset)), FLAGS.preset
  result = {"model": name, "batch": 1, "cpus": os.cpu_count(), "onnxruntime": onnxruntime.__version__,
            **measure(options)}
  json.dump(result, sys.stdout, indent=1)
  print()


if __name__ == "__main__":
  app.run(main)
