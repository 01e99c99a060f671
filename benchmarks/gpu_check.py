"""One-shot accelerator check: train and embed throughput at the original ELMo size; prints one JSON object.

    python benchmarks/gpu_check.py

Runs without flags or edits. On a GPU/TPU: the `original` config (configs/original.py: LSTM 4096/512,
char CNN up to width 7 x 1024 filters, 8192 sampled negatives of a 793,471-word vocabulary as the released
model, Adagrad), global batch 128 x 20 tokens on ONE device, float32 and bfloat16 compute; the real train
loop (`loop.train_and_evaluate`) on an lm1b-shaped run (configs/lm1b.py: original size, bf16, 128 rows per
device on every device, 8,192 sampled of a 793,471-word vocabulary, `shard_softmax`; the embedded corpus
prepared to ids against a synthetic vocabulary of that size, so its targets are mostly <UNK>: the step's
shapes are lm1b's, its loss is not) for its step time, `data_wait_share` (the share of wall time the loop
waited for a batch), the achieved tokens/s, TFLOP/s, MFU and HBM per device of its last log record next to
the planner's roofline prediction the run states at its start, and a jax.profiler trace of two of its
steps (`$GPU_CHECK_PROFILE_DIR`, default <tmp>/elmo_jax_gpu_check_profile; open it with `tensorboard
--logdir` or ui.perfetto.dev, see the README's "Profiling a run"); then
`Embedder.embed_sentences` of random-weight `original`-size ELMo over synthetic sentences. Compile time is
reported apart from the timed steps. Budgeted to finish well under 8 minutes on an H100/H200-class GPU.
On a CPU-only machine it says so (a warning on stderr and `"degraded": true`) and runs tiny sizes, so the
script itself is still exercised. Exit status 1 when a part raised (its error is in the JSON). On a GPU machine
without internet: scripts/device_check.sh (docs/accelerator-stacks.md).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
import warnings

import jax
import numpy as np

from elmo_jax.data import chars
from elmo_jax.formats import options as options_lib
from elmo_jax.model import make_model
from elmo_jax.training import feed, optimizer as optimizer_lib, step as step_lib

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, _ROOT)

ORIGINAL_VOCAB = 793_471  # the released ELMo's vocabulary size


def _load_config(name):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(_ROOT, "configs", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def _batches(n, batch, unroll, max_chars, vocab, seed=0):
  rng = np.random.default_rng(seed)
  words = ["w" + "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(1, 12))) for _ in range(5000)]
  ids = np.stack([chars.token_to_ids(w, max_chars) for w in words]).astype(np.int32)
  out = []
  for _ in range(n):
    tok = rng.integers(0, len(words), (batch, unroll))
    tgt = rng.integers(0, vocab, (batch, unroll)).astype(np.int32)
    c = ids[tok]
    out.append({"fwd_chars": c, "bwd_chars": c[:, ::-1].copy(), "fwd_targets": tgt,
                "bwd_targets": tgt[:, ::-1].copy(), "weights": np.ones((batch, unroll), np.float32)})
  return out


def train_throughput(config_name, dtype, batch, vocab, steps):
  config = _load_config(config_name)
  config.dtype = dtype
  config.batch_size = batch
  options = config.options.to_dict()
  num_sampled = int(config.n_negative_samples) if config.n_negative_samples < vocab else 0
  model = make_model(options, dropout=config.dropout, dtype=config.dtype, unroll=config.get("scan_unroll", 1))
  optimizer = optimizer_lib.make_optimizer(config)
  mesh = step_lib.make_mesh(jax.devices()[:1])
  state = step_lib.create_train_state(model, optimizer, vocab, batch, 0)
  shardings = step_lib.state_shardings(state, mesh)
  state = jax.device_put(state, shardings)
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
  unroll = int(config.unroll_steps)
  batches = [feed.device_batch(b, mesh) for b in
             _batches(3, batch, unroll, options["char_cnn"]["max_characters_per_token"], vocab)]
  t0 = time.perf_counter()
  compiled = train_step.lower(state, batches[0]).compile()
  compile_s = time.perf_counter() - t0
  state, m = compiled(state, batches[0])
  jax.block_until_ready(m)
  times = []
  for k in range(steps):
    t0 = time.perf_counter()
    state, m = compiled(state, batches[k % len(batches)])
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  s = statistics.median(times)
  return {"config": config_name, "dtype": dtype, "batch": batch, "unroll": unroll, "vocab": vocab,
          "num_sampled": num_sampled, "lstm_dim": options["lstm"]["dim"], "compile_s": round(compile_s, 2),
          "step_s_median": round(s, 5), "tokens_per_s": round(batch * unroll / s, 1),
          "loss": float(m["loss"]), "finite": bool(np.isfinite(float(m["loss"])))}


class _Tee(io.StringIO):
  """stdout kept (to read the trainer's own lines back) and still shown."""

  def write(self, text):
    sys.__stdout__.write(text)
    return super().write(text)


def _synthetic_vocab(path, size):
  """A bilm-tf vocabulary of `size` entries (<S>, </S>, <UNK>, then made-up words): lm1b's softmax shape."""
  with open(path, "w") as f:
    f.write("<S>\n</S>\n<UNK>\n" + "".join(f"w{i:07d}\n" for i in range(size - 3)))
  return path


def loop_check(config_name, steps, log_every, vocab_size=0, per_device_batch=0, profile_dir=""):
  """The real trainer (`loop.train_and_evaluate`: prepared corpus, prefetch, device_put ahead) on the embedded
  corpus: step time, the share of wall time the loop waited for a batch (data_wait_share), the achieved
  per-device rates, MFU and HBM of the last log record, the roofline prediction the run states, and (with
  `profile_dir`) a profile of two steps of the first log window. `vocab_size`: a synthetic vocabulary of that
  size (0: the corpus's); `per_device_batch`: rows per device (0: the config's)."""
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  from elmo_jax.training import loop  # pylint: disable=g-import-not-at-top
  config = _load_config(config_name)
  config.num_train_steps = steps
  config.log_every_steps = log_every
  config.eval_every_steps = config.checkpoint_every_steps = 10 * steps
  config.data.train_files = os.path.join(_ROOT, "data", "pd-small", "train.txt.gz")
  config.data.eval_files = ""
  config.data.tfds_name = ""
  config.data.pretokenized = False
  if per_device_batch:
    config.batch_size, config.per_device_batch_size = 0, per_device_batch
  workdir = tempfile.mkdtemp(prefix="gpu_check_loop_")
  if vocab_size:
    config.data.vocab_file = _synthetic_vocab(os.path.join(workdir, "synthetic_vocab.txt"), vocab_size)
    config.data.vocab_max_size = vocab_size
  if profile_dir:  # two steps of the first window: the last one, whose rates are reported, stays untraced
    config.profile_steps, config.profile_dir = f"{max(log_every // 2, 2)}:2", profile_dir
  run = os.path.join(workdir, "run")
  try:
    t0 = time.perf_counter()
    out = _Tee()
    with contextlib.redirect_stdout(out):
      loop.train_and_evaluate(config, run)
    with open(os.path.join(run, "metrics.jsonl")) as f:
      records = [json.loads(line) for line in f if '"train_loss"' in line]
    with open(os.path.join(run, "config.json")) as f:
      batch = json.load(f)["batch_size"]  # the global batch the run resolved
    last = records[-1]  # a window without compile or preparation
    predicted = next((line for line in out.getvalue().splitlines()
                      if line.startswith(("roofline prediction", "no roofline prediction"))), None)
    rate = re.search(r"-> ([\d,]+) tokens/s per device, MFU bound ([\d.]+)%", predicted or "")
    achieved = {k: round(last[k], 4) for k in ("tokens_per_sec_per_device", "tflops_per_sec_per_device", "mfu",
                                               "hbm_in_use_gb", "hbm_peak_gb") if k in last}
    return {"config": config_name, "dtype": config.dtype, "batch": batch, "devices": jax.device_count(),
            "unroll": int(config.unroll_steps), "vocab": vocab_size or None, "steps": steps,
            "window_steps": log_every, "tokens_per_s": round(last["tokens_per_sec"], 1),
            "step_s": round(batch * config.unroll_steps / last["tokens_per_sec"], 5),
            "data_wait_share": round(last["data_wait_share"], 4), "loss": last["train_loss"],
            "achieved": achieved,
            "predicted": {"line": predicted,
                          **({"tokens_per_s_per_device": int(rate.group(1).replace(",", "")),
                              "mfu_bound": float(rate.group(2)) / 100} if rate else {})},
            "profile": _profile_files(profile_dir), "total_s": round(time.perf_counter() - t0, 1)}
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def _profile_files(profile_dir):
  """The trace files a profile_dir holds (relative paths and sizes), or None."""
  if not profile_dir or not os.path.isdir(profile_dir):
    return None
  found = {}
  for root, _, names in os.walk(profile_dir):
    for name in names:
      path = os.path.join(root, name)
      found[os.path.relpath(path, profile_dir)] = os.path.getsize(path)
  return {"dir": profile_dir, "files": found}


def embed_throughput(preset, n_sentences, batch_size):
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  words = ["w" + "".join(rng.choice(list("abcdefghij"), rng.integers(1, 10))) for _ in range(3000)]
  sentences = [[words[i] for i in rng.integers(0, len(words), rng.integers(5, 40))] for _ in range(n_sentences)]
  emb = Embedder.random(options_lib.preset(preset), seed=0)
  t0 = time.perf_counter()
  emb.embed_sentences(sentences, batch_size=batch_size)  # compiles every bucket shape it meets
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  emb.embed_sentences(sentences, batch_size=batch_size)
  s = time.perf_counter() - t0
  n_tok = sum(len(x) for x in sentences)
  return {"preset": preset, "sentences": n_sentences, "tokens": n_tok, "batch_size": batch_size,
          "first_pass_s_incl_compile": round(first, 2), "timed_pass_s": round(s, 3),
          "tokens_per_s": round(n_tok / s, 1), "sentences_per_s": round(n_sentences / s, 1)}


def main():
  t_start = time.perf_counter()
  backend = jax.default_backend()
  degraded = backend == "cpu"
  result = {"backend": backend, "devices": [str(d) for d in jax.devices()][:8], "jax": jax.__version__,
            "degraded": degraded}
  if degraded:
    warnings.warn("gpu_check: no accelerator found; running tiny CPU sizes (numbers are not meaningful)")
    train_cfg, batch, vocab, steps, embed_preset, n_sent = "default", 8, 5_000, 2, "small", 64
  else:
    train_cfg, batch, vocab, steps, embed_preset, n_sent = "original", 128, ORIGINAL_VOCAB, 20, "original", 1000
  result["train"] = []
  for dtype in ("float32", "bfloat16"):
    if time.perf_counter() - t_start > 270:  # keep the whole check under 8 minutes
      result["train"].append({"config": train_cfg, "dtype": dtype, "skipped": "time budget"})
      continue
    try:
      r = train_throughput(train_cfg, dtype, batch, vocab, steps)
    except Exception as e:  # pylint: disable=broad-except
      r = {"config": train_cfg, "dtype": dtype, "error": f"{type(e).__name__}: {e}"[:500]}
    print(json.dumps(r), file=sys.stderr, flush=True)
    result["train"].append(r)
  try:
    if time.perf_counter() - t_start < 300:
      profile_dir = os.environ.get("GPU_CHECK_PROFILE_DIR") or os.path.join(tempfile.gettempdir(),
                                                                             "elmo_jax_gpu_check_profile")
      if degraded:  # the tiny CPU model, 4 rows per device, its corpus's vocabulary
        result["loop"] = loop_check("default", 8, 4, per_device_batch=4, profile_dir=profile_dir)
      else:
        result["loop"] = loop_check("lm1b", 120, 40, vocab_size=ORIGINAL_VOCAB, profile_dir=profile_dir)
    else:
      result["loop"] = {"skipped": "time budget"}
  except Exception as e:  # pylint: disable=broad-except
    result["loop"] = {"error": f"{type(e).__name__}: {e}"[:500]}
  print(json.dumps(result.get("loop")), file=sys.stderr, flush=True)
  try:
    if time.perf_counter() - t_start > 330:
      n_sent //= 4  # fewer sentences, fewer bucket shapes to compile
    result["embed"] = embed_throughput(embed_preset, n_sent, 64)
  except Exception as e:  # pylint: disable=broad-except
    result["embed"] = {"error": f"{type(e).__name__}: {e}"[:500]}
  result["total_s"] = round(time.perf_counter() - t_start, 1)
  print(json.dumps(result, indent=1))
  failed = [r for r in (*result["train"], result.get("loop") or {}, result["embed"]) if "error" in r]
  return 1 if failed else 0  # a part that raised fails the check (its error is in the JSON)


if __name__ == "__main__":
  sys.exit(main())
