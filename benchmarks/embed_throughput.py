"""Throughput of the embedding path (`Embedder` + `embed_file`) on real sentences; prints one JSON object.

    python benchmarks/embed_throughput.py [--preset=small] [--num_sentences=2000] [--batch_size=64]

Random weights of the preset's size (speed does not depend on the values). The first pass over all
sentences compiles every (time bucket, unique-token bucket) shape and is reported as `compile_s`; the
timed passes then hit only compiled shapes. Baselines, reported alongside:
  * `unsorted`: batches in corpus order (still bucketed and deduped), i.e. what length sorting buys;
  * `padding`/`char_cnn` stats: real tokens vs the slots a naive per-batch-max padding without sorting
    would compute, and tokens run through the char CNN with vs without per-batch dedupe (counted, not
    timed: a no-dedupe pass would need its own compiles and adds nothing but a ratio we can count).
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

import jax

from elmo_jax import embed
from elmo_jax import options as options_lib
from elmo_jax.embedder import Embedder, _pow2_at_least, bucket

_CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "corpora", "pd-small",
                       "test.txt.gz")

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "small", "options preset: small | medium | original.")
flags.DEFINE_integer("num_sentences", 2000, "Sentences to embed (capped at what the corpus holds).")
flags.DEFINE_integer("batch_size", 64, "Sentences per batch.")
flags.DEFINE_string("corpus", _CORPUS, "gzip (or plain) raw text, one sentence per line.")
flags.DEFINE_enum("tokenizer", "moses", ["moses", "whitespace"], "How raw lines become tokens.")
flags.DEFINE_bool("unsorted_baseline", True, "Also time batches in corpus order (no length sort).")
flags.DEFINE_bool("embed_file", True, "Also time the end-to-end `embed_file` (text in, HDF5 out).")
flags.DEFINE_integer("seed", 0, "Init seed of the random weights.")
flags.DEFINE_bool("token_cache", True, "Also time cached token embeddings (words seen twice or more) "
                  "against the char path, in interleaved rounds.")


def load_sentences(path: str, n: int, tokenizer: str) -> list[list[str]]:
  """The first `n` non-empty lines of `path`, tokenized."""
  if tokenizer == "moses":
    from elmo_jax.data.tokenize import Tokenizer  # pylint: disable=g-import-not-at-top
    tokenize: Callable[[str], list[str]] = Tokenizer()
  else:
    tokenize = str.split
  opener = gzip.open if path.endswith(".gz") else open
  sentences = []
  with opener(path, "rt", encoding="utf-8") as f:
    for line in f:
      tokens = tokenize(line.strip())
      if tokens:
        sentences.append(tokens)
        if len(sentences) == n:
          break
  return sentences


def batch_stats(sentences: Sequence[Sequence[str]], batch_size: int, sort: bool) -> dict[str, int]:
  """Counts of the work `Embedder.embed_batch` does, and what naive padding / no dedupe would do."""
  order = sorted(range(len(sentences)), key=lambda i: len(sentences[i])) if sort else list(range(len(sentences)))
  stats = {"tokens": 0, "bucketed_slots": 0, "naive_slots": 0, "cnn_unique_padded": 0,
           "cnn_no_dedupe": 0}
  for start in range(0, len(order), batch_size):
    batch = [sentences[i] for i in order[start:start + batch_size]]
    longest = max(len(s) for s in batch)
    stats["tokens"] += sum(len(s) for s in batch)
    # embed_sentences pads a short (last) batch to a power of two of rows, not to batch_size.
    stats["bucketed_slots"] += min(batch_size, _pow2_at_least(len(batch), floor=1)) * bucket(longest)
    stats["naive_slots"] += len(batch) * longest
    stats["cnn_unique_padded"] += _pow2_at_least(len({t for s in batch for t in s}))
    stats["cnn_no_dedupe"] += min(batch_size, _pow2_at_least(len(batch), floor=1)) * bucket(longest)
  return stats


def compiled_shapes(embedder: Embedder) -> dict[str, int]:
  """Entries in the jit caches of the char CNN and the biLSTM (one per compiled input shape)."""
  out = {}
  for name in ("_cnn", "_bilm"):
    fn = getattr(embedder, name)
    out[name.strip("_")] = fn._cache_size() if hasattr(fn, "_cache_size") else -1  # pylint: disable=protected-access
  return out


def timed(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def rates(n_sentences: int, n_tokens: int, seconds: float) -> dict[str, float]:
  return {"seconds": round(seconds, 3), "sentences_per_s": round(n_sentences / seconds, 1),
          "tokens_per_s": round(n_tokens / seconds, 1)}


def unsorted_pass(embedder: Embedder, sentences: list[list[str]], batch_size: int) -> None:
  for start in range(0, len(sentences), batch_size):
    embedder.embed_batch(sentences[start:start + batch_size], pad_batch_to=batch_size)


def token_cache_pass(embedder: Embedder, opts: dict, sentences: list[list[str]], bs: int) -> dict[str, Any]:
  """Cached token embeddings (`--dump_token_embeddings`) for the words seen twice or more, vs the char path."""
  counts: dict[str, int] = {}
  for s in sentences:
    for w in s:
      counts[w] = counts.get(w, 0) + 1
  vocab = [w for w, c in counts.items() if c >= 2]
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "tokens.hdf5")
    dump_s = timed(lambda: embedder.dump_token_embeddings(vocab, path))
    cached = Embedder(opts, embedder.params, token_embedding_file=path)
  covered = sum(c for w, c in counts.items() if c >= 2) / max(sum(counts.values()), 1)
  warm = timed(lambda: cached.embed_sentences(sentences, batch_size=bs))
  a = cached.embed_sentences(sentences[:256], batch_size=bs)
  b = embedder.embed_sentences(sentences[:256], batch_size=bs)
  char_s, cached_s = [], []
  for _ in range(2):  # interleaved A/B rounds: the machine is shared and noisy; keep the best of each
    char_s.append(timed(lambda: embedder.embed_sentences(sentences, batch_size=bs)))
    cached_s.append(timed(lambda: cached.embed_sentences(sentences, batch_size=bs)))
  n_tokens = sum(len(s) for s in sentences)
  return {"vocab_size": len(vocab), "token_coverage": round(covered, 3), "dump_s": round(dump_s, 3),
          "warmup_s": round(warm, 3), "char_path": rates(len(sentences), n_tokens, min(char_s)),
          "cached": rates(len(sentences), n_tokens, min(cached_s)),
          "speedup": round(min(char_s) / min(cached_s), 2),
          "max_abs_diff_vs_char_path": float(max(abs(x - y).max() for x, y in zip(a, b)))}


def main(argv: list[str]) -> None:
  del argv
  load_start = time.perf_counter()
  sentences = load_sentences(FLAGS.corpus, FLAGS.num_sentences, FLAGS.tokenizer)
  load_s = time.perf_counter() - load_start
  n_tokens = sum(len(s) for s in sentences)
  opts = options_lib.preset(FLAGS.preset)
  embedder = Embedder.random(opts, seed=FLAGS.seed)
  bs = FLAGS.batch_size
  result: dict[str, Any] = {
      "preset": FLAGS.preset, "backend": jax.default_backend(), "devices": len(jax.devices()),
      "cpu_count": os.cpu_count(), "batch_size": bs, "num_sentences": len(sentences),
      "num_sentences_requested": FLAGS.num_sentences, "num_tokens": n_tokens,
      "mean_tokens_per_sentence": round(n_tokens / len(sentences), 1), "tokenizer": FLAGS.tokenizer,
      "tokenize_s": round(load_s, 3),
  }
  # Warm-up: the same sorted batches as the timed pass, so it compiles exactly the shapes used later.
  result["compile_s"] = round(timed(lambda: embedder.embed_sentences(sentences, batch_size=bs)), 3)
  result["compiled_shapes"] = compiled_shapes(embedder)
  result["embed_sentences"] = rates(len(sentences), n_tokens,
                                    timed(lambda: embedder.embed_sentences(sentences, batch_size=bs)))
  result["compiled_shapes_after_timed_pass"] = compiled_shapes(embedder)
  if FLAGS.embed_file:
    with tempfile.TemporaryDirectory() as tmp:
      text = os.path.join(tmp, "in.txt")
      with open(text, "w", encoding="utf-8") as f:
        f.writelines(" ".join(s) + "\n" for s in sentences)
      out = os.path.join(tmp, "out.hdf5")
      seconds = timed(lambda: embed.embed_file(embedder, text, out, bs, progress_every=None))
      result["embed_file"] = {**rates(len(sentences), n_tokens, seconds),
                              "output_mb": round(os.path.getsize(out) / 2**20, 1)}
  if FLAGS.token_cache:
    result["token_cache"] = token_cache_pass(embedder, opts, sentences, bs)
  if FLAGS.unsorted_baseline:
    warm = timed(lambda: unsorted_pass(embedder, sentences, bs))  # compiles any new unique-token buckets
    result["unsorted"] = {**rates(len(sentences), n_tokens, timed(lambda: unsorted_pass(embedder, sentences, bs))),
                          "warmup_s": round(warm, 3)}
    result["speedup_sorted_vs_unsorted"] = round(
        result["unsorted"]["seconds"] / result["embed_sentences"]["seconds"], 2)
  sorted_stats = batch_stats(sentences, bs, sort=True)
  unsorted_stats = batch_stats(sentences, bs, sort=False)
  result["padding"] = {
      "real_tokens": n_tokens,
      "sorted_bucketed_slots": sorted_stats["bucketed_slots"],
      "unsorted_bucketed_slots": unsorted_stats["bucketed_slots"],
      "naive_unsorted_batch_max_slots": unsorted_stats["naive_slots"],
      "lstm_efficiency_sorted_bucketed": round(n_tokens / sorted_stats["bucketed_slots"], 3),
      "lstm_efficiency_naive_unsorted": round(n_tokens / unsorted_stats["naive_slots"], 3),
  }
  result["char_cnn"] = {
      "tokens_with_dedupe": sorted_stats["cnn_unique_padded"],
      "tokens_without_dedupe": sorted_stats["cnn_no_dedupe"],
      "dedupe_saving": round(1 - sorted_stats["cnn_unique_padded"] / sorted_stats["cnn_no_dedupe"], 3),
  }
  print(json.dumps(result, indent=2))
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
