"""Latency of embedding a sentence (or a few) at a time, next to AllenNLP's `Elmo`; prints one JSON object.

    python benchmarks/embed_latency.py [--presets=small,original] [--calls=300] [--allennlp_path=/tmp/allennlp_pkg]

Random weights of each preset's released shape (latency does not depend on the values), real sentences from
the corpus in data/. Per preset, two fresh processes share a new persistent compilation cache folder:
`cold_cache` (empty: the load compiles every shape) and `warm_cache` (the load reads them back). Each reports:
  * `init_params_s` (random weights, not part of a real load), `load_s` (`Embedder(..., warm=True)`: every
    shape compiled or read from the cache) and the compiles it counted, `first_call_s`;
  * per batch size (1, 4, 16 sentences a call): `ms` p50/p95/p99/max/mean over --calls calls after --warmup
    calls, `max_over_p50`, and AllenNLP's `Elmo` on the same sentences, interleaved call by call
    (`baseline_ms`, `p50_ratio` = ours / AllenNLP's);
  * `compiles_after_load`: traces and XLA compiles from the first call to the last (0 when warm works);
  * `typical_call`: where a single-sentence call of the mix goes, phase by phase over --split_calls sentences
    the table has not seen (`latency_floor.typical_split`: host ids, char CNN of new tokens, biLSTM, copy; what
    the calls did; ours / the floor per call); `floor`: the floor model (`latency_floor.py`: FLOPs / the
    measured matmul peak vs weight bytes / the measured read bandwidth, per program), its p50 over the same
    calls, per sentence length, and `batch_1.ours_over_floor`;
  * with batch size 1, in the same interleaving on the same sentences: `stateful_ms`, the stateful Embedder (one
    sentence a call, like AllenNLP's `Elmo`, stateful by default); `flax_ms`, `load_elmo`'s `Elmo` + a jitted
    `apply` on `batch_to_ids` padded to the Embedder's warm buckets (the Flax API; `ids` and `apply` split);
  * per row, `by_length`: the same stats per band of the call's longest sentence (1-16, 17-32, 33-64, ... tokens:
    within a factor of two), where `max_over_p50` is the spread of calls of like length, not the mix's lengths.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from absl import app
from absl import flags

from bench_util import clock, load_sentences, matmul_peak, stats
import latency_floor

import numpy as np

FLAGS = flags.FLAGS
_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "pd-small", "train.txt.gz")
flags.DEFINE_list("presets", ["small", "original"], "options presets (small | medium | original).")
flags.DEFINE_string("options_file", None, "an options.json instead of the presets (e.g. a tiny smoke test).")
flags.DEFINE_integer("calls", 300, "timed calls per batch size.")
flags.DEFINE_integer("warmup", 50, "untimed calls first (the token table fills with frequent words).")
flags.DEFINE_list("batch_sizes", ["1", "4", "16"], "sentences per call.")
flags.DEFINE_integer("split_calls", 50, "single-sentence calls timed phase by phase.")
flags.DEFINE_string("corpus", _CORPUS, "gzip (or plain) text, one whitespace-tokenized sentence per line.")
flags.DEFINE_string("allennlp_path", "/tmp/allennlp_pkg", "pip --target folder holding allennlp 2.10.1 "
                    "(benchmarks/allennlp_baseline.py); empty or missing: no baseline.")
flags.DEFINE_bool("cold_cache", True, "also measure a load with an empty compilation cache (a process of its own).")
flags.DEFINE_string("child", None, "internal: measure this preset in this process.")
flags.DEFINE_bool("latency", True, "internal: measure the latency tables too (else load and first call).")


def options_of(preset: str) -> dict[str, Any]:
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  if FLAGS.options_file:
    return options_lib.load(FLAGS.options_file)
  return options_lib.validate(options_lib.preset(preset))


def baseline(options: dict[str, Any], params: Any, folder: str) -> Any:
  """AllenNLP's `Elmo` on the same weights, or None (the reason printed to stderr)."""
  if not FLAGS.allennlp_path:
    return None
  from allennlp_baseline import AllenNLPElmo  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import weights as weights_lib  # pylint: disable=g-import-not-at-top
  options_file, weight_file = os.path.join(folder, "options.json"), os.path.join(folder, "weights.hdf5")
  options_lib.save(options, options_file)
  weights_lib.save_hdf5(weight_file, params, options)
  try:
    return AllenNLPElmo(FLAGS.allennlp_path, options_file, weight_file)
  except ImportError as e:
    print(f"no AllenNLP baseline: {e}", file=sys.stderr)
    return None


# Bands of a call's longest sentence, each within a factor of two of length (a call's work grows with it)
_BANDS = ((1, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, 512), (513, 1 << 30))


def latency(embeds: dict[str, Callable[[list], Any]], other: Callable[[list], Any] | None, groups: list[list]
            ) -> dict[str, dict]:
  """Warm-up calls, then `--calls` timed ones: each group embedded by every one of `embeds` and by `other` (the
  baseline) in turn, the order rotating from call to call. Per name: `ms` (stats), `by_length` (stats per band
  of the group's longest sentence: a long sentence's call costs more than a short one's by its length, not by
  jitter) and, with a baseline, `baseline_ms` and `p50_ratio` (ours / the baseline's, the same calls)."""
  runs = {**embeds, **({"baseline": other} if other is not None else {})}
  names = list(runs)
  for g in groups[:FLAGS.warmup]:
    for name in names:
      runs[name](g)
  timed = groups[FLAGS.warmup:FLAGS.warmup + FLAGS.calls]
  ms: dict[str, list[float]] = {name: [] for name in names}
  for k, g in enumerate(timed):
    for name in names[k % len(names):] + names[:k % len(names)]:
      ms[name].append(clock(lambda: runs[name](g)))
  longest = np.array([max(len(s) for s in g) for g in timed])
  out = {}
  for name in embeds:
    out[name] = {"ms": stats(ms[name]), "by_length": {
        f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+": {"calls": int(sum(m)), **stats(np.asarray(ms[name])[m])}
        for lo, hi in _BANDS if (m := (longest >= lo) & (longest <= hi)).any()}}
    # the tail at like length: the largest max / p50 among the bands (the whole mix's is the longest call's)
    out[name]["like_length_max_over_p50"] = max(b["max_over_p50"] for b in out[name]["by_length"].values())
    if other is not None:
      out[name]["baseline_ms"] = stats(ms["baseline"])
      out[name]["p50_ratio"] = round(out[name]["ms"]["p50"] / out[name]["baseline_ms"]["p50"], 3)
  return out


class FlaxElmo:
  """The Flax API on a group of sentences: `Elmo` (what `load_elmo` builds) and one jitted `apply` of
  `batch_to_ids` padded to the Embedder's warm buckets, each bucket compiled at construction (`compile_s`);
  `split_ms` after the calls: host ids and apply, medians."""

  def __init__(self, options: dict[str, Any], params: Any):
    import jax  # pylint: disable=g-import-not-at-top
    from elmo_jax.embedding.host_batch import WARM_TIME_BUCKETS  # pylint: disable=g-import-not-at-top
    from elmo_jax.model import BiLMConfig, Elmo, elmo_variables  # pylint: disable=g-import-not-at-top
    elmo = Elmo(BiLMConfig.from_options(options), dropout=0.0)
    self.variables = elmo_variables(elmo, params)
    self.apply = jax.jit(lambda v, ids: elmo.apply(v, ids)["elmo_representations"][0])
    self.width = options["char_cnn"]["max_characters_per_token"]
    start = time.perf_counter()
    for t in WARM_TIME_BUCKETS:
      jax.block_until_ready(self.apply(self.variables, np.zeros((1, t, self.width), np.int32)))
    self.compile_s = round(time.perf_counter() - start, 2)
    self.ids_ms, self.apply_ms = [], []

  def __call__(self, group: list[list[str]]) -> np.ndarray:
    from elmo_jax.data import chars  # pylint: disable=g-import-not-at-top
    from elmo_jax.embedding.host_batch import WARM_TIME_BUCKETS, bucket  # pylint: disable=g-import-not-at-top
    t0 = time.perf_counter()
    ids = chars.batch_to_ids(group, max_chars=self.width, pad_to=bucket(max(map(len, group)), WARM_TIME_BUCKETS))
    t1 = time.perf_counter()
    out = np.asarray(self.apply(self.variables, ids))
    self.ids_ms.append((t1 - t0) * 1e3)
    self.apply_ms.append((time.perf_counter() - t1) * 1e3)
    return out

  def split_ms(self) -> dict[str, float]:
    return {"ids": round(statistics.median(self.ids_ms), 3), "apply": round(statistics.median(self.apply_ms), 3)}


def measure(preset: str, with_latency: bool) -> dict[str, Any]:
  """One process: load (compile counted), first call, then (`with_latency`) the latency tables."""
  import jax  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.model import BiLM, BiLMConfig  # pylint: disable=g-import-not-at-top
  from elmo_jax.runtime.compile_count import CompileCounter  # pylint: disable=g-import-not-at-top
  options = options_of(preset)
  start = time.perf_counter()
  dummy = np.zeros((1, 1, options["char_cnn"]["max_characters_per_token"]), np.int32)
  params = jax.device_get(jax.jit(BiLM(BiLMConfig.from_options(options)).init)(jax.random.key(0), dummy)["params"])
  out: dict[str, Any] = {"preset": preset, "init_params_s": round(time.perf_counter() - start, 2)}
  with CompileCounter() as load:
    start = time.perf_counter()
    emb = Embedder(options, params, warm=True)
    out["load_s"] = round(time.perf_counter() - start, 2)
  out["load_compiles"] = load.as_dict()
  n = max(int(b) for b in FLAGS.batch_sizes) * (FLAGS.warmup + FLAGS.calls)
  sentences = load_sentences(FLAGS.corpus, n)
  floor = latency_floor.Floor(options, matmul_peak()) if with_latency else None  # its own compiles: not a call's
  if with_latency:  # loaded (compiled) before the count: single sentences through the other two paths
    singles = {"stateful": Embedder(options, params, stateful=True, warm=True).embed_sentences,
               "flax": FlaxElmo(options, params)}
  with CompileCounter() as after:
    out["first_call_s"] = round(clock(lambda: emb.embed_sentences([sentences[0]])) / 1e3, 3)
    if with_latency:
      with tempfile.TemporaryDirectory() as folder:
        other = baseline(options, params, folder)
        out["baseline"] = None if other is None else "allennlp==2.10.1 Elmo (benchmarks/allennlp_baseline.py)"
        for b in map(int, FLAGS.batch_sizes):
          groups = [sentences[i:i + b] for i in range(0, len(sentences) - b + 1, b)]
          runs = latency({"ours": emb.embed_sentences, **(singles if b == 1 else {})}, other, groups)
          out[f"batch_{b}"] = runs["ours"]
          if b == 1:
            out["stateful_ms"] = runs["stateful"]
            out["flax_ms"] = {**runs["flax"], "compile_s": singles["flax"].compile_s,
                              "split_ms": singles["flax"].split_ms()}
      unseen = load_sentences(FLAGS.corpus, n + FLAGS.split_calls)[n:]  # the mix's next sentences, new to the table
      out["typical_call"] = latency_floor.typical_split(emb, unseen, floor)
      calls = out["typical_call"]["calls"]
      out["floor"] = {**floor.describe(), "p50_ms": out["typical_call"]["floor_ms_p50"],
                      "by_length_ms": latency_floor.by_length(floor, calls["new_tokens"] / calls["tokens"],
                                                              out["typical_call"]["new_token_width_mean"])}
      out["batch_1"]["ours_over_floor"] = round(out["batch_1"]["ms"]["p50"] / out["floor"]["p50_ms"], 2) \
          if "batch_1" in out else None
  out["compiles_after_load"] = after.as_dict()
  out["devices"] = [str(d) for d in jax.local_devices()]
  return out


def run_child(preset: str, cache: str, with_latency: bool) -> dict[str, Any]:
  argv = [sys.executable, os.path.abspath(__file__), f"--child={preset}", f"--presets={preset}",
          f"--calls={FLAGS.calls}", f"--warmup={FLAGS.warmup}", f"--batch_sizes={','.join(FLAGS.batch_sizes)}",
          f"--split_calls={FLAGS.split_calls}", f"--corpus={FLAGS.corpus}",
          f"--allennlp_path={FLAGS.allennlp_path if with_latency else ''}", f"--latency={with_latency}"]
  if FLAGS.options_file:
    argv.append(f"--options_file={FLAGS.options_file}")
  env = {**os.environ, "ELMO_JAX_CACHE": cache, "JAX_COMPILATION_CACHE_DIR": ""}
  proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f"{preset}: the measuring process failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str]) -> None:
  del argv
  if FLAGS.child:
    print(json.dumps(measure(FLAGS.child, FLAGS.latency)))
    return
  import platform  # pylint: disable=g-import-not-at-top
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)), check=False).stdout.strip()
  result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "commit": commit,
                            "calls": FLAGS.calls, "warmup": FLAGS.warmup, "presets": {}}
  for preset in (["custom"] if FLAGS.options_file else FLAGS.presets):
    with tempfile.TemporaryDirectory() as cache:
      cold = run_child(preset, cache, with_latency=False) if FLAGS.cold_cache else None
      warm = run_child(preset, cache, with_latency=True)
    result["presets"][preset] = {"cold_cache": cold, "warm_cache": warm}
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  app.run(main)
