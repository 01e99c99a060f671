"""How fast the host feeds the devices; prints one JSON object.

    PYTHONPATH=. python benchmarks/input_pipeline.py [--text=data/pd-small/train.txt.gz] [--num_workers=1,2]

  raw_tokens_per_s       today's raw-text stream (Moses or whitespace tokenizing + char ids + dedupe_batch),
                         one thread, batch 128 x 20, dedupe on
  prepare_tokens_per_s   `elmo_jax.data.prepare` (tokenize + merge), per --num_workers tried
  prepared_tokens_per_s  the prepared-corpus stream at 128 x 20 with dedupe (by type id), one process
  data_wait_share        the real train loop (`loop.train_and_evaluate`: prefetcher, device_put, log window)
                         with the model step replaced by a jitted busy computation of ~5 ms and ~50 ms: the
                         share of wall time the loop waited for a batch. On a shared 2-core CPU the busy
                         step and the batch thread compete for the same cores; on an accelerator they do not.
Raw/prepared rates are the best of 3 interleaved rounds (the machine is shared).
"""
from __future__ import annotations

import argparse
import os

# The simulated "device" computes on one core, so the batch thread has the other (as host and accelerator).
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
import json
import shutil
import sys
import tempfile
import time

import flax
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from elmo_jax.data import TextSource, Tokenizer, make_lm_iterator  # noqa: E402
from elmo_jax.data.prepare import prepare  # noqa: E402
from elmo_jax.data.prepared import PreparedCorpus, make_prepared_iterator  # noqa: E402
from elmo_jax.data import dedupe as dedupe_lib  # noqa: E402
from elmo_jax.training import step as step_lib  # noqa: E402

B, U = 128, 20


def _rate(iterator, seconds: float, transform=lambda b: b) -> float:
  n, started = 0.0, time.perf_counter()
  while time.perf_counter() - started < seconds:
    n += float(transform(next(iterator))["weights"].sum())
  return n / (time.perf_counter() - started)


def _busy_step(target_s: float):
  """A jitted computation of ~target_s that consumes the batch, standing in for the model's step."""
  w = jnp.eye(256, dtype=jnp.float32) * 0.5

  def body(n):
    def step(state, batch):
      x = jnp.ones((256, 256), jnp.float32) + jnp.sum(batch["weights"]) * 0.0
      x = jax.lax.fori_loop(0, n, lambda _, x: jnp.tanh(x @ w), x)
      loss = jnp.mean(x) * 0.0 + 1.0
      metrics = {"loss": loss, "loss_forward": loss, "loss_backward": loss, "grad_norm": loss,
                 "n_tokens": jnp.sum(batch["weights"])}
      return state.replace(step=state.step + 1), metrics
    return step

  @flax.struct.dataclass
  class Probe:
    step: jax.Array

  def measure(n: int) -> float:
    f = jax.jit(body(n))
    state, batch = Probe(jnp.zeros((), jnp.int32)), {"weights": jnp.ones((B, U))}
    jax.block_until_ready(f(state, batch))
    started = time.perf_counter()
    for _ in range(20):
      state, m = f(state, batch)
    jax.block_until_ready(m)
    return (time.perf_counter() - started) / 20

  n = 20
  for _ in range(3):  # the same jitted function the loop runs, scaled until it takes target_s
    n = max(1, round(n * target_s / measure(n)))
  return body(n), measure(n)


def data_wait_share(text: str, target_s: float, steps: int) -> dict[str, float]:
  from elmo_jax.training.config import base_config  # pylint: disable=g-import-not-at-top
  from elmo_jax.training import loop  # pylint: disable=g-import-not-at-top
  busy, busy_s = _busy_step(target_s)

  def fake_make_train_step(model, optimizer, mesh, shardings, num_sampled=0):
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(busy, in_shardings=(shardings, step_lib.batch_sharding(mesh)),
                   out_shardings=(shardings, replicated), donate_argnums=(0,))

  original = step_lib.make_train_step
  step_lib.make_train_step = fake_make_train_step
  workdir = tempfile.mkdtemp(prefix="input_pipeline_")
  try:
    c = base_config()
    c.options.lstm.dim, c.options.lstm.projection_dim = 16, 8
    c.options.char_cnn.filters = [[1, 4], [2, 4]]
    c.batch_size, c.unroll_steps, c.num_train_steps = B, U, steps
    c.log_every_steps = steps // 2
    c.eval_every_steps = c.checkpoint_every_steps = 10 * steps
    c.data.train_files, c.data.eval_files = text, ""
    loop.train_and_evaluate(c, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      last = [json.loads(line) for line in f][-1]  # the second window: no compile, no preparation
    return {"data_wait_share": round(last["data_wait_share"], 4), "tokens_per_s": round(last["tokens_per_sec"]),
            "step_s": round(B * U / last["tokens_per_sec"], 5), "busy_step_alone_s": round(busy_s, 5)}
  finally:
    step_lib.make_train_step = original
    shutil.rmtree(workdir, ignore_errors=True)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--text", default="data/pd-small/train.txt.gz")
  parser.add_argument("--num_workers", default="1,2")
  parser.add_argument("--seconds", type=float, default=4.0)
  args = parser.parse_args()
  from elmo_jax.runtime import progress  # pylint: disable=g-import-not-at-top
  progress.set_enabled(False)
  out: dict = {"batch": [B, U], "dedupe": True, "cpu_count": os.cpu_count(), "text": args.text}
  tmp = tempfile.mkdtemp(prefix="input_pipeline_prep_")
  try:
    prepare_rates = {}
    for w in [int(x) for x in args.num_workers.split(",")]:
      target = os.path.join(tmp, f"w{w}")
      started = time.perf_counter()
      manifest = prepare(target, [args.text], num_workers=w, chunk_sentences=2000, log_line=lambda _: None)
      prepare_rates[str(w)] = round(manifest["counts"]["n_tokens"] / (time.perf_counter() - started))
    out["prepare_tokens_per_s"] = prepare_rates
    out["corpus_tokens"] = manifest["counts"]["n_tokens"]
    corpus = PreparedCorpus(target)
    vocab = corpus.vocab()
    source = TextSource(args.text)
    mesh1 = 1  # one process, one device shard
    raw_rates, prepared_rates = [], []
    for _ in range(3):  # interleaved rounds
      raw = make_lm_iterator(source, vocab, Tokenizer(), batch_size=B, unroll_steps=U, seed=0,
                             process_index=0, process_count=1)
      raw_rates.append(_rate(raw, args.seconds, lambda b: dedupe_lib.dedupe_batch(b, mesh1)))
      prepared = make_prepared_iterator(corpus, vocab, batch_size=B, unroll_steps=U, seed=0, process_index=0,
                                        process_count=1, dedupe_shards=mesh1)
      prepared_rates.append(_rate(prepared, args.seconds))
    out["raw_tokens_per_s"] = {"1": round(max(raw_rates))}  # the raw stream has no workers: one thread
    out["prepared_tokens_per_s"] = round(max(prepared_rates))
    out["prepared_over_raw"] = round(max(prepared_rates) / max(raw_rates), 1)
    out["simulated_step"] = {"5ms": data_wait_share(args.text, 0.005, 200),
                             "50ms": data_wait_share(args.text, 0.05, 40)}
    out["data_wait_share_5ms"] = out["simulated_step"]["5ms"]["data_wait_share"]
    out["data_wait_share_50ms"] = out["simulated_step"]["50ms"]["data_wait_share"]
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
