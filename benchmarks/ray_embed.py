"""A corpus on Ray against the embed command on one machine, the Beam handler, and what a billion tokens cost;
prints one JSON object (bash benchmarks/run_all.sh --only=cluster records it).

    python benchmarks/ray_embed.py [--preset=small] [--lines=20000] [--rounds=2] [--original_lines=600]
        [--beam_python=.venv-beam/bin/python]

Random weights of each preset's released shape in a temporary model folder (speed does not depend on the
values); the shipped corpus's lines (data/pd-mix). Each run is the command a person types, in a fresh process,
timed from its start to its exit (Python, JAX, the model, the compiled shapes from the persistent cache, and for
Ray a local cluster started by the command):
  * `throughput`: `elmo-jax embed` (local) and `elmo-jax embed --engine=ray` with 1 and 2 actors (`--actor_cpus=1`),
    interleaved over --rounds (local, ray1, ray2, then the reverse): tokens/s of each (the median round), the Ray
    runs' ratio to the local one (`ray1.over_local`), the share of the actors' time not spent in their shards
    (`engine_overhead`: scheduling, start-up, the cluster), seconds of scheduling and start per shard, and each
    process's peak resident memory;
  * `original`: the same for the `original` preset with one actor, over --original_lines lines: what an actor
    of the big model does on this machine;
  * `bytes_per_token`: the shard bytes per token of each output choice (layers / top / average / a mix /
    sentence vectors; float32 and float16; Parquet and HDF5), written by the engine's own shard writer from
    the original preset's layers;
  * `beam`: the Beam handler on its in-process runner (FnApiRunner), tokens/s, where --beam_python runs;
  * `cost`: hours to embed 10M, 1B and 10B tokens of each preset on N machines like this one (one actor each,
    the measured tokens/s per actor), and on one GPU / TPU chip at a bound no run passes (`cost`'s docstring):
    a lower bound on hours, not a measurement.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Sequence

from absl import app
from absl import flags

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "small", "options preset of the throughput runs.")
flags.DEFINE_integer("lines", 20000, "Lines of the corpus in the throughput runs (all it has, if fewer).")
flags.DEFINE_integer("rounds", 2, "Interleaved rounds of the throughput runs.")
flags.DEFINE_integer("original_lines", 600, "Lines of the original preset's runs (0: none).")
flags.DEFINE_integer("bytes_lines", 200, "Lines whose shards measure the bytes per token.")
flags.DEFINE_string("beam_python", os.path.join(_ROOT, ".venv-beam", "bin", "python"),
                    "A Python with the beam extra (scripts/test_beam.sh makes .venv-beam); missing: no Beam run.")
flags.DEFINE_integer("beam_lines", 2000, "Lines of the Beam run.")
flags.DEFINE_string("corpus", os.path.join(_ROOT, "data", "pd-mix", "train.txt.gz"), "one sentence per line "
                    "(the shipped pd-mix corpus: 133,601 lines).")
flags.DEFINE_string("options_file", None, "an options.json instead of the presets (a smoke test).")

TOKENS = (10e6, 1e9, 10e9)
MACHINES = (1, 10, 100)
CHIPS = ("h100", "h200", "v5e")


def write_model(folder: str, preset: str) -> dict[str, Any]:
  """Random weights of the preset's shape as options.json + weights.hdf5 in `folder`; returns the options."""
  import jax  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import weights as weights_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.model import BiLM, BiLMConfig  # pylint: disable=g-import-not-at-top
  options = options_lib.validate(options_lib.load(FLAGS.options_file) if FLAGS.options_file
                                 else options_lib.preset(preset))
  dummy = np.zeros((1, 1, options["char_cnn"]["max_characters_per_token"]), np.int32)
  params = jax.device_get(jax.jit(BiLM(BiLMConfig.from_options(options)).init)(jax.random.key(0), dummy)["params"])
  os.makedirs(folder, exist_ok=True)
  options_lib.save(options, os.path.join(folder, "options.json"))
  weights_lib.save_hdf5(os.path.join(folder, "weights.hdf5"), params, options)
  return options


def write_lines(path: str, n: int) -> tuple[int, int]:
  """The corpus's first `n` non-empty lines (all it has, if fewer) into `path`; returns their (lines, tokens)."""
  lines = tokens = 0
  with gzip.open(FLAGS.corpus, "rt", encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
    for line in f:
      if line.split():
        out.write(line)
        lines, tokens = lines + 1, tokens + len(line.split())
        if lines == n:
          break
  return lines, tokens


class PeakMemory:
  """The peak resident memory (MB) of every process whose command line matches `pattern`, polled."""

  def __init__(self, pattern: str):
    self.pattern, self.peak, self._stop = re.compile(pattern), {}, threading.Event()
    self._thread = threading.Thread(target=self._poll, daemon=True)
    self._thread.start()

  def _poll(self) -> None:
    while not self._stop.is_set():
      for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
          with open(path, "rb") as f:  # arguments are NUL-separated
            if not self.pattern.search(f.read().replace(b"\0", b" ").decode(errors="replace")):
              continue
          with open(path.replace("cmdline", "status")) as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        except (OSError, StopIteration, ValueError):
          continue
        pid = path.split("/")[2]
        self.peak[pid] = max(self.peak.get(pid, 0.0), rss)
      self._stop.wait(0.25)

  def stop(self) -> list[float]:
    self._stop.set()
    self._thread.join()
    return sorted(round(v, 1) for v in self.peak.values())


def run_command(kind: str, model: str, text: str, work: str, tokens: int) -> dict[str, Any]:
  """One run of the embed command (`local`, `ray1`, `ray2`) in a fresh process: wall seconds, tokens/s, memory."""
  out = os.path.join(work, f"{kind}-{time.monotonic_ns()}")
  command = [sys.executable, "-m", "elmo_jax", "embed", f"--model={model}", f"--input_file={text}", "--average",
             "--noprogress"]
  if kind == "local":
    command.append(f"--output_file={out}.hdf5")
    memory = PeakMemory(r"elmo_jax embed .*--output_file=" + re.escape(out))
  else:
    command += ["--engine=ray", f"--output_dir={out}", f"--actors={kind[-1]}", "--actor_cpus=1"]
    memory = PeakMemory(r"EmbedShards")
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  peaks = memory.stop()
  if done.returncode:
    raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
  result = {"wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1), "peak_rss_mb": peaks}
  if kind == "local":  # its own last line: "... N tokens in S s (...)": the embedding alone, without start-up
    seconds = float(re.search(r"tokens in ([\d.]+) s", done.stderr).group(1))
    result.update({"embed_s": seconds, "tokens_per_s_embedding": round(tokens / seconds, 1)})
  else:
    records = [json.load(open(p)) for p in glob.glob(os.path.join(out, "shard-*.json"))]
    busy = sum(r["seconds"] for r in records)
    actors = int(kind[-1])
    result.update({"shards": len(records), "actor_busy_s": round(busy, 2),
                   "tokens_per_s_per_actor_busy": round(tokens / busy, 1),
                   "engine_overhead": round(1 - busy / (actors * wall), 3),
                   "overhead_s_per_shard": round((actors * wall - busy) / len(records), 3)})
  return result


def throughput(model: str, text: str, work: str, counts: tuple[int, int], kinds: Sequence[str],
               rounds: int) -> dict[str, Any]:
  """`kinds` interleaved over `rounds` (in order, then reversed); each kind's median round and the ratios."""
  lines, tokens = counts
  runs: dict[str, list[dict]] = {k: [] for k in kinds}
  for r in range(rounds):
    for kind in (kinds if r % 2 == 0 else kinds[::-1]):
      runs[kind].append(run_command(kind, model, text, work, tokens))
      print(f"[ray_embed] round {r} {kind}: {runs[kind][-1]['tokens_per_s']} tokens/s", file=sys.stderr)
  out: dict[str, Any] = {"lines": lines, "tokens": tokens}
  for kind, results in runs.items():
    median = sorted(results, key=lambda x: x["tokens_per_s"])[len(results) // 2]
    out[kind] = {**median, "rounds_tokens_per_s": [x["tokens_per_s"] for x in results]}
  for kind in kinds[1:]:  # start to exit; and an actor at work against the embed command at work
    out[kind]["over_local"] = round(out[kind]["tokens_per_s"] / out["local"]["tokens_per_s"], 3)
    out[kind]["busy_over_local_embedding"] = round(
        out[kind]["tokens_per_s_per_actor_busy"] / out["local"]["tokens_per_s_embedding"], 3)
  return out


def bytes_per_token(model: str, text: str, work: str) -> dict[str, Any]:
  """Shard bytes per token of each output choice, written by the engine's shard writer."""
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.engines import corpus, shard_files, worker  # pylint: disable=g-import-not-at-top
  embedder = Embedder.from_pretrained(model, warm=False)
  shard = corpus.shards(corpus.input_files([corpus.scan(text, 1 << 30)]), 1 << 30)[0]
  lines = [(line, t, t.split()) for line, t, _ in corpus.read_shard(shard)]
  layers = worker.embed_lines(embedder, [tokens for _, _, tokens in lines], worker.output_format("layers"), str)
  n_tokens = sum(len(tokens) for _, _, tokens in lines)
  choices = {"layers": ("layers", None, False), "top": ("top", None, False), "average": ("average", None, False),
             "mix": ("mix", [1 / 3] * embedder.n_layers, False), "sentence_vectors": ("average", None, True)}
  out: dict[str, Any] = {"tokens": n_tokens, "lines": len(lines), "dim": embedder.output_dim}
  from elmo_jax.embedding import parts  # pylint: disable=g-import-not-at-top
  for name, (output, mix, vectors) in choices.items():
    for dtype in ("float32", "float16"):
      fmt = worker.output_format(output, mix, vectors, dtype)
      for output_format in shard_files.FORMATS:
        folder = os.path.join(work, f"bytes-{name}-{dtype}-{output_format}")
        os.makedirs(folder)
        writer = shard_files.ShardWriter(folder, shard, output_format, dtype)
        for (line, t, _), array in zip(lines, layers):
          writer.put(line, line, t, parts.line_output(array, fmt, "bench"))
        _, size = writer.close()
        out.setdefault(name, {}).setdefault(dtype, {})[output_format] = round(size / n_tokens, 1)
  return out


def beam_run(model: str, text: str, tokens: int) -> dict[str, Any] | None:
  """The Beam handler on FnApiRunner over `text`, in --beam_python (None where it is missing)."""
  if not os.path.exists(FLAGS.beam_python):
    return None
  script = f"""
import time, apache_beam as beam
from apache_beam.ml.inference.base import RunInference
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from elmo_jax.engines.beam import ElmoModelHandler
start = time.perf_counter()
with beam.Pipeline(runner=FnApiRunner()) as p:
  _ = (p | beam.io.ReadFromText({text!r}) | RunInference(ElmoModelHandler({model!r}, output="average"))
       | beam.Map(lambda r: r.inference.shape[0]) | beam.combiners.Count.Globally())
print(time.perf_counter() - start)
"""
  start = time.perf_counter()
  done = subprocess.run([FLAGS.beam_python, "-c", script], capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"the Beam run failed:\n{done.stderr[-2000:]}")
  return {"wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1), "tokens": tokens}


def cost(rates: dict[str, float], options: dict[str, dict]) -> dict[str, Any]:
  """Hours for 10M / 1B / 10B tokens: on N machines like this one (the measured tokens/s per actor, one actor a
  machine), and on one GPU / TPU chip at a bound no run can pass, at 64 and 512 rows per device: the smaller of
  the analytic FLOP count at the chip's peak and the biLSTM's weights read from HBM once per time step (float32:
  every step of every row needs all of them, and they outgrow the caches)."""
  from elmo_jax.measure import chips, flops  # pylint: disable=g-import-not-at-top
  out: dict[str, Any] = {}
  for preset, rate in rates.items():
    per_token = flops.forward_flops_per_token(options[preset], vocab=0, num_sampled=0,
                                              cnn_rows_per_token=1.0)["total"]
    lstm = options[preset]["lstm"]
    p, h = lstm["projection_dim"], lstm["dim"]
    weight_bytes = 4 * lstm["n_layers"] * 2 * ((p + p) * 4 * h + 4 * h + h * p)  # both directions, float32
    out[preset] = {"cpu_tokens_per_s_per_machine": rate, "forward_mflops_per_token": round(per_token / 1e6, 2),
                   "lstm_weights_mb": round(weight_bytes / 1e6, 1)}
    for n in MACHINES:
      for t in TOKENS:
        out[preset][f"cpu_machines_{n}.tokens_{t:.0e}.hours"] = round(t / (rate * n) / 3600, 2)
    for chip in CHIPS:
      for rows in (64, 512):
        bound = min(chips.CHIPS[chip].peak_flops / per_token, rows * chips.CHIPS[chip].hbm_bandwidth / weight_bytes)
        out[preset][f"{chip}.rows_{rows}.bound_tokens_per_s"] = round(bound)
        for t in TOKENS:
          out[preset][f"{chip}.rows_{rows}.tokens_{t:.0e}.hours_at_least"] = round(t / bound / 3600, 4)
  return out


def main(argv: Sequence[str]) -> None:
  del argv
  result: dict[str, Any] = {"preset": "custom" if FLAGS.options_file else FLAGS.preset}
  with tempfile.TemporaryDirectory() as work:
    options = {FLAGS.preset: write_model(os.path.join(work, "model"), FLAGS.preset)}
    text = os.path.join(work, "corpus.txt")
    result["throughput"] = throughput(os.path.join(work, "model"), text, work, write_lines(text, FLAGS.lines),
                                      ("local", "ray1", "ray2"), FLAGS.rounds)
    rates = {FLAGS.preset: result["throughput"]["ray1"]["tokens_per_s_per_actor_busy"]}
    if FLAGS.original_lines and not FLAGS.options_file:
      options["original"] = write_model(os.path.join(work, "original"), "original")
      small_text = os.path.join(work, "original.txt")
      result["original"] = throughput(os.path.join(work, "original"), small_text, work,
                                      write_lines(small_text, FLAGS.original_lines), ("local", "ray1"), FLAGS.rounds)
      rates["original"] = result["original"]["ray1"]["tokens_per_s_per_actor_busy"]
      bytes_text = os.path.join(work, "bytes.txt")
      write_lines(bytes_text, FLAGS.bytes_lines)
      result["bytes_per_token"] = bytes_per_token(os.path.join(work, "original"), bytes_text, work)
    if FLAGS.beam_lines:
      beam_text = os.path.join(work, "beam.txt")
      beam = beam_run(os.path.join(work, "model"), beam_text, write_lines(beam_text, FLAGS.beam_lines)[1])
      if beam is not None:
        result["beam"] = beam
    result["cost"] = cost(rates, options)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  app.run(main)
