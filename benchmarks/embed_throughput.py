"""Throughput of the embedding path (`Embedder` + `embed_file`) on real sentences; prints one JSON object.

    python benchmarks/embed_throughput.py [--presets=small,original] [--batch_sizes=32,64,128,256]
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/embed_throughput.py --devices=8

Random weights of each preset's size (speed does not depend on the values), sentences from the corpus in
data/ (nothing outside the repository). Per preset and batch size:
  * `compile_s`: the first pass over all sentences (compiles every shape it meets; with a warm persistent
    compilation cache it only loads them);
  * `steady`: the pipelined `embed_sentences` (batch k+1 prepared and dispatched before batch k is fetched),
    median of --passes timed passes: tokens/s, FLOP/s executed and `mfu` = that over the matmul peak
    measured in the same run (`matmul_peak_flops`);
  * `split`: one synchronous pass timing each phase per batch -- host prep (char ids, dedupe, padding), char
    CNN + highway + projection of the tokens not yet in the token table, gather + biLSTM (one program), device->host copy, HDF5 write -- with each phase's share,
    FLOPs executed and GFLOP/s (the split's total is slower than `steady`, which overlaps them);
  * `embed_file`: the end-to-end CLI function, text in, HDF5 out (second call; the first, which compiles
    the CLI's full-row last batches, as `first_seconds`).
FLOPs count the matmuls/convolutions as executed, padding included (char CNN rows padded to its chunks and
char widths, biLSTM rows x (longest row + <S>/</S>) steps); `useful_flops_per_token` counts real tokens only
(every token through the CNN at its width, no padding). `peak_rss_mb` is the process's peak so far;
`memory_mb` the resident memory after each stage (`rss`, its `anon` and `file` parts, and `hwm`, the peak
so far), to tell the model, the compiled shapes and the held outputs apart. With `--devices=N`, `devices`:
the same params on N local devices vs 1 (`embed_sentences` and `embed_file`, interleaved rounds): tokens/s
of each, their ratio and the outputs' largest difference.
"""
from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

import h5py
import jax
import numpy as np

from bench_util import matmul_peak, memory_mb, peak_rss_mb  # pylint: disable=g-bad-import-order
from elmo_jax.embedding import writer as embed
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.embedding.step import char_widths as _char_widths
from elmo_jax.formats import options as options_lib
from elmo_jax.model import BiLM, BiLMConfig
from elmo_jax.runtime import memory

_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "pd-small", "train.txt.gz")

FLAGS = flags.FLAGS
flags.DEFINE_bool("reuse_freed_memory", True, "glibc keeps freed blocks for reuse (memory.reuse_freed_memory), "
                  "as the command-line entry points do.")
flags.DEFINE_list("presets", ["small"], "options presets: small | medium | original.")
flags.DEFINE_list("batch_sizes", ["64"], "Sentences per batch, e.g. 32,64,128,256.")
flags.DEFINE_integer("num_sentences", 2000, "Sentences to embed (capped at what the corpus holds).")
flags.DEFINE_integer("num_sentences_original", 256, "Sentences for the original preset (~10x the FLOPs).")
flags.DEFINE_integer("passes", 3, "Timed steady-state passes (median).")
flags.DEFINE_string("corpus", _CORPUS, "gzip (or plain) raw text, one sentence per line.")
flags.DEFINE_enum("tokenizer", "moses", ["moses", "whitespace"], "How raw lines become tokens.")
flags.DEFINE_bool("split", True, "Time each phase in a synchronous pass.")
flags.DEFINE_bool("embed_file", True, "Also time the end-to-end `embed_file` (text in, HDF5 out).")
flags.DEFINE_integer("seed", 0, "Init seed of the random weights.")
flags.DEFINE_integer("devices", 1, "Also compare the Embedder on this many local devices with 1 (e.g. 8, with "
                     "XLA_FLAGS=--xla_force_host_platform_device_count=8 on a CPU).")
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


# --- FLOPs (2 per multiply-add) ---------------------------------------------------------------------------
def cnn_flops_per_row(cfg, width: int) -> float:
  """Char CNN + highway + projection of one token over `width` char positions."""
  d = sum(n for _, n in cfg.filters)
  conv = sum(2 * (width - w + 1) * w * cfg.char_dim * n for w, n in cfg.filters)
  return conv + cfg.n_highway * 2 * 2 * d * d + (2 * d * cfg.projection_dim if d != cfg.projection_dim else 0)


def lstm_flops_per_step(cfg) -> float:
  """One row-step of all layers, both directions: input gates, recurrent gates, projection."""
  p, h = cfg.projection_dim, cfg.lstm_dim
  return 2 * cfg.n_layers * (2 * p * 4 * h + 2 * p * 4 * h + 2 * h * p)


def batch_flops(cfg, prepared) -> dict[str, float]:
  rows = prepared.mask.shape[0]
  steps = int(prepared.mask.sum(axis=1).max()) + 2  # the LSTM loop stops after the longest row + <S>, </S>
  cnn = sum(c.shape[0] * cnn_flops_per_row(cfg, c.shape[1]) for c in prepared.chunks)
  cnn += 2 * cnn_flops_per_row(cfg, cfg.max_characters_per_token)  # <S>, </S>
  return {"cnn": cnn, "lstm": rows * steps * lstm_flops_per_step(cfg)}


def useful_flops_per_token(embedder: Embedder, sentences: Sequence[Sequence[str]]) -> float:
  """Real tokens only: each distinct token of the corpus once through the CNN (at its char width, a
  lower bound of per-batch dedupe), and each token + <S>/</S> per sentence through the biLSTM."""
  cfg = embedder.config
  distinct = sorted({t for s in sentences for t in s})
  ids = np.stack([embedder._char_ids(t) for t in distinct])  # pylint: disable=protected-access
  cnn = sum(cnn_flops_per_row(cfg, int(w)) for w in _char_widths(ids, max(w for w, _ in cfg.filters)))
  n_tokens = sum(len(s) for s in sentences)
  lstm = (n_tokens + 2 * len(sentences)) * lstm_flops_per_step(cfg)
  return (cnn + lstm) / n_tokens


def random_embedder(preset: str, seed: int, devices: int = 1) -> Embedder:
  """Random weights of the preset, initialised in one compiled program.

  A user's model is loaded from a weight file, which compiles nothing; `Embedder.random`'s eager init
  (kept eager: its values are the untrained twins' and must not move by a rounding) leaves ~300 MB of
  one-op executables in JAX's caches on the small preset, which would be charged to the embedding here.
  """
  options = options_lib.validate(options_lib.preset(preset))
  dummy = np.zeros((1, 1, options["char_cnn"]["max_characters_per_token"]), np.int32)
  params = jax.jit(BiLM(BiLMConfig.from_options(options)).init)(jax.random.key(seed), dummy)["params"]
  return Embedder(options, params, devices=devices, warm=False)  # as the embed command loads it


# --- passes ---------------------------------------------------------------------------------------------
def timed(fn: Callable[[], Any], *cold: Embedder) -> float:
  """Seconds of `fn()`; the `cold` embedders first forget the char-CNN outputs they hold, so each timed
  pass embeds the sentences as a new file would (a long file's later batches find more words cached)."""
  for embedder in cold:
    embedder.clear_token_table()
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def batches(embedder: Embedder, sentences, batch_size: int) -> list[list[int]]:
  order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
  return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]


def split_pass(embedder: Embedder, sentences, batch_size: int) -> dict[str, Any]:
  """One pass, each phase blocked on before the next starts; seconds and FLOPs per phase, summed."""
  cfg = embedder.config
  phases = {k: 0.0 for k in ("host_prep", "char_cnn", "bilstm", "device_to_host", "hdf5_write")}
  flops = {"cnn": 0.0, "lstm": 0.0}
  per_batch = []
  with tempfile.TemporaryDirectory() as tmp, h5py.File(os.path.join(tmp, "split.hdf5"), "w") as fout:
    for chunk in batches(embedder, sentences, batch_size):
      t = [time.perf_counter()]
      rows = min(batch_size, 1 << max(0, len(chunk) - 1).bit_length())  # as Embedder.batches pads
      prepared = embedder._prepare([sentences[i] for i in chunk], rows)  # pylint: disable=protected-access
      t.append(time.perf_counter())
      # pylint: disable=protected-access
      embedder._write_new_tokens(prepared)
      positions = embedder._steps.put_rows(prepared.positions)
      jax.block_until_ready(embedder._table)
      t.append(time.perf_counter())  # the gather runs with the biLM, in one program
      layers = jax.block_until_ready(embedder._steps.layers(embedder.params, embedder.constants, embedder._table,
                                                            positions))
      # pylint: enable=protected-access
      t.append(time.perf_counter())
      host = np.asarray(layers)[:len(chunk)]
      t.append(time.perf_counter())
      for row, i in enumerate(chunk):
        fout.create_dataset(str(i), data=host[row, :, :len(sentences[i])], dtype="float32")
      t.append(time.perf_counter())
      for k, name in enumerate(phases):
        phases[name] += t[k + 1] - t[k]
      f = batch_flops(cfg, prepared)
      flops["cnn"] += f["cnn"]
      flops["lstm"] += f["lstm"]
      per_batch.append({"rows": rows, "time": int(prepared.mask.shape[1]) - 2, "cnn_chunks": len(prepared.chunks),
                        "ms": [round(1e3 * (b - a), 1) for a, b in zip(t, t[1:])]})
  total = sum(phases.values())
  out = {"seconds": round(total, 3),
         "phases": {k: {"seconds": round(v, 3), "share": round(v / total, 3)} for k, v in phases.items()},
         "char_cnn_gflops_per_s": round(flops["cnn"] / phases["char_cnn"] / 1e9, 1),
         "bilstm_gflops_per_s": round(flops["lstm"] / phases["bilstm"] / 1e9, 1),
         "batches": len(per_batch), "per_batch_ms_columns": list(phases), "per_batch": per_batch}
  return out, flops


def bench(preset: str, sentences: list[list[str]], batch_sizes: Sequence[int], peak: float) -> dict[str, Any]:
  n_tokens = sum(len(s) for s in sentences)
  embedder = random_embedder(preset, FLAGS.seed)
  out: dict[str, Any] = {"num_sentences": len(sentences), "num_tokens": n_tokens,
                         "useful_flops_per_token": round(useful_flops_per_token(embedder, sentences)),
                         "memory_mb_model": memory_mb()}
  for bs in batch_sizes:
    r: dict[str, Any] = {"memory_mb": {}}
    start = time.perf_counter()
    held = embedder.embed_sentences(sentences, batch_size=bs)  # the first pass: compiles every shape
    r["compile_s"] = round(time.perf_counter() - start, 2)
    r["output_mb"] = round(sum(x.nbytes for x in held) / 2**20, 1)
    r["memory_mb"]["first_pass_output_held"] = memory_mb()
    del held
    r["compiled_shapes"] = {name: getattr(embedder._steps, name)._cache_size()  # pylint: disable=protected-access
                            for name in ("cnn_into", "layers")}
    embedder.clear_token_table()
    split, flops = split_pass(embedder, sentences, bs) if FLAGS.split else ({}, None)
    secs = [timed(lambda: embedder.embed_sentences(sentences, batch_size=bs), embedder)
            for _ in range(FLAGS.passes)]
    s = statistics.median(secs)
    r["steady"] = {"seconds": round(s, 3), "seconds_per_pass": [round(x, 3) for x in secs],
                   "tokens_per_s": round(n_tokens / s, 1), "sentences_per_s": round(len(sentences) / s, 1)}
    r["memory_mb"]["steady"] = memory_mb()
    if flops:
      executed = flops["cnn"] + flops["lstm"]
      r["steady"].update(executed_gflops=round(executed / 1e9, 1), gflops_per_s=round(executed / s / 1e9, 1),
                         mfu=round(executed / s / peak, 3),
                         useful_mfu=round(out["useful_flops_per_token"] * n_tokens / s / peak, 3))
      r["split"] = split
    if FLAGS.embed_file:
      with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "in.txt")
        with open(text, "w", encoding="utf-8") as f:
          f.writelines(" ".join(s) + "\n" for s in sentences)
        path = os.path.join(tmp, "out.hdf5")
        warm = timed(lambda: embed.embed_file(embedder, text, path, bs, progress_every=None), embedder)
        seconds = timed(lambda: embed.embed_file(embedder, text, path, bs, progress_every=None), embedder)
        r["embed_file"] = {"first_seconds": round(warm, 3), "seconds": round(seconds, 3),
                           "tokens_per_s": round(n_tokens / seconds, 1),
                           "output_mb": round(os.path.getsize(path) / 2**20, 1)}
      r["memory_mb"]["embed_file"] = memory_mb()
    r["peak_rss_mb"] = round(peak_rss_mb(), 1)
    print(json.dumps({preset: {bs: r}}), file=sys.stderr)
    out[f"batch_{bs}"] = r
  if FLAGS.token_cache:
    out["token_cache"] = token_cache_pass(embedder, options_lib.preset(preset), sentences, batch_sizes[0])
  if FLAGS.devices > 1:
    out["devices"] = devices_pass(embedder, sentences, batch_sizes[0])
  return out


def devices_pass(one: Embedder, sentences: list[list[str]], bs: int) -> dict[str, Any]:
  """`--devices=N` vs 1 device on the same params, in interleaved rounds (the machine is noisy): steady
  `embed_sentences` and end-to-end `embed_file`, N devices at their default batch (64 per device) and at
  the 1-device batch `bs`; the outputs' largest difference."""
  many = Embedder(one.options, one.params, devices=FLAGS.devices)
  n_tokens = sum(len(s) for s in sentences)
  runs = {"1_device": (one, bs), f"{FLAGS.devices}_devices": (many, many.default_batch_size),
          f"{FLAGS.devices}_devices_batch_{bs}": (many, bs)}
  diff = max(float(abs(a - b).max()) for a, b in zip(one.embed_sentences(sentences, bs),
                                                      many.embed_sentences(sentences)))  # compiles too
  secs: dict[str, list[float]] = {}
  with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "in.txt")
    with open(text, "w", encoding="utf-8") as f:
      f.writelines(" ".join(s) + "\n" for s in sentences)
    for e, b in runs.values():  # the first calls compile every shape they meet
      e.embed_sentences(sentences, b)
      embed.embed_file(e, text, os.path.join(tmp, "warm.hdf5"), b, progress_every=None)
    for _ in range(FLAGS.passes):
      for name, (e, b) in runs.items():
        secs.setdefault(name, []).append(timed(lambda: e.embed_sentences(sentences, batch_size=b), e))
        secs.setdefault(f"embed_file_{name}", []).append(timed(
            lambda: embed.embed_file(e, text, os.path.join(tmp, "o.hdf5"), b, progress_every=None), e))
  med = {k: statistics.median(v) for k, v in secs.items()}
  return {"batch_sizes": {k: b for k, (_, b) in runs.items()}, "max_abs_diff": diff,
          "seconds_per_pass": {k: [round(x, 3) for x in v] for k, v in secs.items()},
          "tokens_per_s": {k: round(n_tokens / v, 1) for k, v in med.items()},
          "ratio_to_1_device": {k: round(med[("embed_file_" if k.startswith("embed_file") else "") + "1_device"] / v, 3)
                                for k, v in med.items()}}


def rates(n_sentences: int, n_tokens: int, seconds: float) -> dict[str, float]:
  return {"seconds": round(seconds, 3), "sentences_per_s": round(n_sentences / seconds, 1),
          "tokens_per_s": round(n_tokens / seconds, 1)}


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
  memory = {"dumped": memory_mb()}
  covered = sum(c for w, c in counts.items() if c >= 2) / max(sum(counts.values()), 1)
  # The A/B passes stream their batches (as embed_file does) rather than hold every output, so this
  # comparison adds no second set of held outputs to the process's peak.
  def stream(e: Embedder) -> int:
    return sum(len(rows) for _, rows, _, _ in e.batches(sentences, bs))
  warm = timed(lambda: stream(cached))
  a = cached.embed_sentences(sentences[:256], batch_size=bs)
  b = embedder.embed_sentences(sentences[:256], batch_size=bs)
  memory["cached_warm"] = memory_mb()
  char_s, cached_s = [], []
  for _ in range(2):  # interleaved A/B rounds: the machine is shared and noisy; keep the best of each
    char_s.append(timed(lambda: stream(embedder), embedder))
    cached_s.append(timed(lambda: stream(cached), cached))
  memory["rounds"] = memory_mb()
  n_tokens = sum(len(s) for s in sentences)
  return {"memory_mb": memory, "vocab_size": len(vocab), "token_coverage": round(covered, 3), "dump_s": round(dump_s, 3),
          "warmup_s": round(warm, 3), "char_path": rates(len(sentences), n_tokens, min(char_s)),
          "cached": rates(len(sentences), n_tokens, min(cached_s)),
          "speedup": round(min(char_s) / min(cached_s), 2),
          "max_abs_diff_vs_char_path": float(max(abs(x - y).max() for x, y in zip(a, b)))}


def main(argv: list[str]) -> None:
  del argv
  # first, before JAX allocates, as the command-line entry points do (elmo_jax/runtime/memory.py)
  reused = FLAGS.reuse_freed_memory and memory.reuse_freed_memory()
  result: dict[str, Any] = {"backend": jax.default_backend(), "devices": len(jax.devices()),
                            "cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg(),
                            "corpus": os.path.relpath(FLAGS.corpus), "tokenizer": FLAGS.tokenizer}
  result["reuse_freed_memory"] = reused
  result["memory_mb_start"] = memory_mb()
  peak = matmul_peak()
  result["matmul_peak_flops"] = round(peak)
  batch_sizes = [int(b) for b in FLAGS.batch_sizes]
  for preset in FLAGS.presets:
    n = FLAGS.num_sentences_original if preset == "original" else FLAGS.num_sentences
    sentences = load_sentences(FLAGS.corpus, n, FLAGS.tokenizer)
    result[preset] = bench(preset, sentences, batch_sizes, peak)
  result["matmul_peak_flops_end"] = round(matmul_peak())  # the machine is shared: was the peak stable?
  result["load_avg_end"] = os.getloadavg()
  result["peak_rss_mb"] = round(peak_rss_mb(), 1)
  print(json.dumps(result, indent=1))
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
