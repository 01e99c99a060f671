"""The train loop, top to bottom: input -> sharded state -> restore or init -> steps -> logs, evals, saves.

Shaped like flax's examples/lm1b/train.py. The host never waits on the devices between steps: batches are
built and put on the devices ahead by `input.Prefetcher`, metrics stay on the devices until a log step
(`metrics.LogWindow`), and with several processes the stop check is a collective only every
`config.stop_check_every_steps` steps.
"""
from __future__ import annotations

import collections
import itertools
import os
import signal
import time
from typing import Any

import jax
import ml_collections

from elmo_jax.runtime import log
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.interop import options as options_lib
from elmo_jax.model import make_model, zero_state
from elmo_jax.training import init_from, lm_eval, resume, step as step_lib
from elmo_jax.training import input as input_lib
from elmo_jax.training.checkpoint import (Checkpointer, IncompatibleCheckpointError, abstract_like,
                                          gather_process_states)
from elmo_jax.training.distributed import StopRequest
from elmo_jax.training.export import export_model
from elmo_jax.training.metrics import LogWindow, MetricWriter, progress_line
from elmo_jax.runtime.run_layout import METRICS_FILE
from elmo_jax.training.workdir import Workdir

def _every(step: int, n: int, last: int) -> bool:
  return step % n == 0 or step == last


TEST_SIGNAL_ENV = "ELMO_JAX_TEST_SIGNAL_AT_STEP"


def signal_self_for_tests(step: int, checkpointer: Checkpointer, run: Workdir) -> None:
  """The fault tests' deterministic preemption: with `ELMO_JAX_TEST_SIGNAL_AT_STEP=N:KILL` (or `N:TERM`),
  this process sends itself SIGKILL (SIGTERM) once step N is logged and saved and every pending save (and a
  bucket workdir's upload) is done, instead of a test racing a sleep-paced run with a timed kill. Unset:
  nothing happens."""
  spec = os.environ.get(TEST_SIGNAL_ENV)
  if not spec:
    return
  at, name = spec.split(":")
  if int(at) == step:
    checkpointer.wait()
    run.flush()
    os.kill(os.getpid(), getattr(signal, f"SIG{name}"))


def restore_or_init(config, run: Workdir, checkpointer, state, train_iter, check, optimizer, options, vocab,
                    shardings):
  """(state, open log-window sums) from the newest good checkpoint, else `config.init_from`, else fresh."""
  restored = checkpointer.restore(abstract_like(state), check)
  if restored is not None:
    restored_step, state, meta = restored
    try:
      train_iter.set_state(meta["data"][jax.process_index()])
    except ValueError as e:  # the preflight compares configs; this is the data stream's own test
      raise IncompatibleCheckpointError(f"{checkpointer.directory} (step {restored_step}): {e}") from None
    dropped = 0
    if jax.process_index() == 0:
      dropped = resume.rewind_metrics(run.local, restored_step)
      run.push(METRICS_FILE)
    log.info(f"resumed from step {restored_step} in {checkpointer.directory}"
                  + (f" (dropped {dropped} metrics.jsonl records written after it)" if dropped else ""),
                  all_processes=True)  # every process restores its own data position
    return state, meta.get("log_window")
  if config.init_from:
    state, source = init_from.apply(config.init_from, state, options, vocab.sha256(), optimizer, shardings)
    log.info(f"initialised from {source}; fresh optimizer")
    if source.endswith(init_from.NEW_SOFTMAX + ")") and not config.get("freeze_bilm_steps", 0):
      log.info("init_from gave no softmax for this vocabulary: a random softmax's first gradients reach the "
               "pretrained biLM; consider --config.freeze_bilm_steps=200 (softmax alone first), or "
               "--config.data.vocab_file=<the source run's vocab.txt> to keep its softmax")
  return state, None


def make_feed(train_iter, mesh, dedupe: bool, depth: int, block: int):
  """Batches built (and, with one process, put on the devices) on a background thread, `depth` ahead.

  Several processes: the thread builds the host batches; `AgreedFeed` agrees on the dedupe table sizes once
  per `block` steps (a collective, so on the main thread) and puts the batches on the devices.
  """
  host = lambda b: step_lib.host_batch(b, mesh, dedupe)
  if jax.process_count() == 1:
    return input_lib.Prefetcher(train_iter, lambda b: step_lib.to_devices(host(b), mesh), depth)
  return input_lib.AgreedFeed(input_lib.Prefetcher(train_iter, host, max(depth, block)), mesh, block)


# Over 60 lines on purpose: the loop reads top to bottom as flax's examples/lm1b train_and_evaluate (setup,
# restore, step loop); its steps share the state, the feed and the writers, and helpers would hide the order.
def log_unigram_baseline(config, data, vocab, writer: MetricWriter, n_proc: int) -> None:
  """The eval split's unigram perplexity as metrics.jsonl's step-0 record (process 0; a fresh run).

  Process 0 reads every shard; with one process these are exactly the targets the biLM's eval scores
  (several processes: the same number of batch rows, drawn from the unsharded split).
  """
  batches = data.eval(process_index=0, process_count=1)
  if config.eval_max_batches:
    batches = itertools.islice(batches, config.eval_max_batches * n_proc)
  base = lm_eval.unigram_baseline(vocab, batches)
  writer.write({"step": 0, **base})
  log.info(f"unigram baseline on the eval split: ppl {base['unigram_ppl']:.1f}, OOV rate {base['oov_rate']:.2%}")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains per `config` in `workdir` (a local path or a bucket URL: `training/workdir.py`), resuming if it
  holds a checkpoint; returns the last metrics.

  Resuming is exact: the checkpoint holds the train state (incl. RNG and carried LSTM state), every
  process's data position and the open log window, and metrics.jsonl is rewound to the restored step.
  SIGTERM/SIGINT finish the current step, save and return normally.
  """
  # Long on purpose (flax lm1b's shape): setup, restore, and the step loop read top to bottom in one place;
  # what stands alone lives outside (restore_or_init, make_feed, LogWindow, log_unigram_baseline).
  # --- setup ---------------------------------------------------------------------------------------------
  run = Workdir(workdir)
  is_main = jax.process_index() == 0
  if is_main:  # a bucket workdir: the copy this process writes starts as the bucket's (again since the
    run.pull()  # preflight's pull: another trainer may have written before this one took the lock)
  workdir = run.local
  os.makedirs(workdir, exist_ok=True)
  options = options_lib.validate(config.options.to_dict(), "config.options")
  n_devices, n_proc = jax.device_count(), jax.process_count()
  if config.batch_size % n_devices:
    raise ValueError(f"config.batch_size={config.batch_size} must be divisible by the {n_devices} devices")
  local_rows = config.batch_size // n_proc
  data = input_lib.make_input(config, run, local_rows)
  vocab = data.vocab
  if is_main:
    files.write_json(os.path.join(workdir, "config.json"), config.to_dict())
    run.push("config.json", "vocab.txt")

  mesh = step_lib.make_mesh()
  model = make_model(options, dropout=config.dropout, dtype=config.dtype,
                     unroll=config.get("scan_unroll", 1))
  optimizer = step_lib.make_optimizer(config)
  num_sampled = config.n_negative_samples if 0 < config.n_negative_samples < len(vocab) - 1 else 0
  create = lambda: step_lib.create_train_state(model, optimizer, len(vocab), config.batch_size, config.seed)
  shardings = step_lib.state_shardings(jax.eval_shape(create), mesh, bool(config.get("shard_softmax", False)))
  state = jax.jit(create, out_shardings=shardings)()
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
  eval_step = step_lib.make_eval_step(model, mesh, shardings.params)
  dedupe = bool(config.get("dedupe_tokens", False))
  train_iter = data.train(dedupe_shards=len(mesh.local_devices) if dedupe else None)
  train_source = input_lib.train_source(config.data)

  # --- restore or init -----------------------------------------------------------------------------------
  checkpointer = Checkpointer(run.checkpoints, keep=config.keep_checkpoints)
  compatible = lambda meta: resume.check_compatible(meta, config, options, vocab.sha256(), n_proc, run.path)
  state, window_sums = restore_or_init(config, run, checkpointer, state, train_iter, compatible, optimizer,
                                       options, vocab, shardings)
  start_step = int(state.step)
  data_state = train_iter.get_state()  # the position after the last batch a step consumed

  def run_eval(params) -> dict[str, Any]:
    if data.eval is None:
      return {}
    zero = jax.device_put(zero_state(model.config, config.batch_size), shardings.lstm_state)
    to_global = lambda b: step_lib.global_arrays(b, mesh, dedupe=dedupe)
    batches = lm_eval.with_progress(data.eval(), data.eval_sentences // n_proc, config.eval_max_batches, "eval",
                                    disable=not is_main)
    result = lm_eval.perplexity(eval_step, params, zero, batches, to_global, config.eval_max_batches)
    return {"eval_ppl_forward": result["ppl_forward"], "eval_ppl_backward": result["ppl_backward"],
            "eval_ppl": result["ppl"], "eval_tokens": result["n_tokens"]}

  def save(step: int) -> None:
    log_window.pause()  # fetches and checks the pending steps: a checkpoint never holds a non-finite state
    checkpointer.save(step, state, {"data": gather_process_states(data_state), "vocab_sha256": vocab.sha256(),
                                    "config": config.to_dict(), "log_window": log_window.sums,
                                    "train_source": train_source})
    if is_main:
      export_model(workdir, state.params, options)
      run.push("export")

  writer = MetricWriter(workdir, enabled=is_main, purge_step=start_step + 1, config=config.to_dict(),
                        uploaded=run.push_soon if run.remote else None)
  if is_main and data.eval is not None and start_step == 0:
    log_unigram_baseline(config, data, vocab, writer, n_proc)
  log.info(f"training {config.num_train_steps} steps of {config.batch_size} x {config.unroll_steps} tokens on "
           f"{n_devices} device(s) / {n_proc} process(es) from {data.description}; vocab {len(vocab):,}; "
           f"{'sampled softmax ' + str(num_sampled) if num_sampled else 'full softmax'}")

  freeze = int(config.get("freeze_bilm_steps", 0) or 0)
  if start_step < freeze:
    log.info(f"biLM frozen for steps {start_step + 1}-{min(freeze, config.num_train_steps)}: only the "
             f"softmax trains (config.freeze_bilm_steps={freeze})")

  # --- the step loop -------------------------------------------------------------------------------------
  started = time.time()
  record: dict[str, Any] = {}
  log_window = LogWindow(window_sums)
  last = config.num_train_steps
  stop_every = 1 if n_proc == 1 else max(int(config.get("stop_check_every_steps", 10)), 1)
  ahead = max(int(config.get("prefetch_batches", 2)), 1)
  feed = make_feed(train_iter, mesh, dedupe, ahead, stop_every)
  in_flight: collections.deque = collections.deque()
  stop = StopRequest()
  waited, since = 0.0, time.time()  # the feed's wait time and the wall clock at the last log line
  try:  # the handlers, the feed thread and the writers are put back however the loop ends (a raise included)
    for step in range(start_step, last):
      if in_flight and not feed.ready():
        # Nothing to dispatch yet: let the devices finish first, so the wait timed next (data_wait_share)
        # is time the devices sat idle for want of a batch. Costs nothing: the host could not go on anyway.
        jax.block_until_ready(in_flight[-1])
      batch, data_state = feed.next()
      state, metrics = train_step(state, batch)
      done = step + 1
      log_window.add(done, metrics)
      # The host stays `ahead` steps in front of the devices, no further: queued work stays bounded, and the
      # time it waits for a batch (data_wait_share) is time the devices would wait too.
      in_flight.append(metrics)
      if len(in_flight) > ahead:
        jax.block_until_ready(in_flight.popleft())
      if done == freeze and done < last:
        log.info(f"step {done}: biLM unfrozen (config.freeze_bilm_steps={freeze}); everything trains from here")
      if _every(done, config.log_every_steps, last):
        now = time.time()
        record = {**log_window.record(done), "learning_rate": step_lib.learning_rate_at(config, done),
                  "elapsed_sec": now - started,
                  # share of the wall time the devices waited for a batch
                  "data_wait_share": (feed.wait_sec - waited) / max(now - since, 1e-9)}
        waited, since = feed.wait_sec, now
        writer.write(record)
        if is_main:
          log.info(progress_line(done, last, record, started, start_step))
      if _every(done, config.eval_every_steps, last) and data.eval is not None:
        log_window.pause()
        result = run_eval(state.params)
        writer.write({"step": done, **result})
        log.info(f"step {done}: eval ppl {result['eval_ppl']:.1f} (forward {result['eval_ppl_forward']:.1f}, "
                 f"backward {result['eval_ppl_backward']:.1f})")
        record = {**record, **result}
      saved = _every(done, config.checkpoint_every_steps, last)
      if saved:
        save(done)
      signal_self_for_tests(done, checkpointer, run)
      # Every process asks at the same steps, so all of them stop after the same one.
      if (done % stop_every == 0 or done == last) and stop.requested():
        if not saved:
          save(done)
        log.info(f"stopped by {stop.signal_name or 'another process'} after step {done}: saved checkpoint "
                 f"{checkpointer.directory}/{done}; run the same command again to resume")
        return record
  finally:
    feed.close()
    stop.restore()
    checkpointer.close()  # waits for the last asynchronous save and its checksum; never half-written
    writer.close()
    run.flush(raise_error=False)  # a bucket workdir: the last metrics uploaded before the run returns
  run.flush()  # and a failed last upload is an error of a run that otherwise finished
  counts = data_state["counters"]
  log.info(f"done: step {int(state.step)}; read {counts['sentences']:,} sentences, {counts['tokens']:,} words "
           f"({counts['truncated_tokens']:,} over-long tokens truncated); checkpoints in {checkpointer.directory}; "
           f"export in {storage.join(run.path, 'export')}", all_processes=True)  # each process's data counts differ
  return record
