"""The train loop, top to bottom: input -> sharded state -> restore or init -> steps -> logs, evals, saves.

Shaped like flax's examples/lm1b/train.py. The host never waits on the devices between steps: batches are
built and put on the devices ahead by `feed.make_feed`, metrics stay on the devices until a log step
(`metrics.LogWindow`), and with several processes the stop check is a collective only every
`config.stop_check_every_steps` steps.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import os
import time
from typing import Any, Callable

import jax
import ml_collections

from elmo_jax.formats import options as options_lib
from elmo_jax.model import BiLM, make_model, zero_state
from elmo_jax.runtime import files, log, storage
from elmo_jax.runtime.run_layout import (CONFIG_FILE, EXPORT_DIR, METRICS_FILE, START_FILES,
                                         VOCAB_COUNTS_FILE)
from elmo_jax.training import init_from, lm_eval, optimizer as optimizer_lib, resume, step as step_lib, variant
from elmo_jax.training import input as input_lib
from elmo_jax.training.config import with_global_batch
from elmo_jax.training.checkpoint import (Checkpointer, IncompatibleCheckpointError, abstract_like,
                                          gather_process_states)
from elmo_jax.runtime.distributed import StopRequest
from elmo_jax.training.export import export_model
from elmo_jax.training.feed import device_batch, make_feed
from elmo_jax.training.metrics import LogWindow, MetricWriter, progress_line
from elmo_jax.training.profile import Profiler
from elmo_jax.training.throughput import Throughput
from elmo_jax.training.workdir import Workdir

# after_step(step, flush): called after every step's logs, eval and save; flush() waits until every save
# (and a bucket workdir's upload) is done. The fault tests use it to stop a run at a known point.
AfterStep = Callable[[int, Callable[[], None]], None]


def _every(step: int, n: int, last: int) -> bool:
  return step % n == 0 or step == last


@dataclasses.dataclass
class Steps:
  """The compiled side of a run (`make_steps`): the mesh, the state's layout and the two steps."""
  mesh: Any
  model: BiLM
  optimizer: Any
  shardings: step_lib.TrainState
  train_step: Callable
  eval_step: Callable
  num_sampled: int  # 0: full softmax


def open_run(config: ml_collections.ConfigDict, workdir: str) -> tuple[Workdir, dict[str, Any], input_lib.TrainInput]:
  """The workdir (a bucket's: its local copy, pulled), the checked model options and the run's input; process
  0 writes vocab.txt (+ counts) and, for a new run, config.json, and uploads `run_layout.START_FILES`: a
  rerun or an evaluation on a fresh machine finds them in the bucket before the first checkpoint. A
  resumed run's config.json is rewritten only once its checkpoint was restored (`record_config`): a
  refused restore leaves it as it was. `config` is resolved (`config.with_global_batch`)."""
  run = Workdir(workdir)
  if jax.process_index() == 0:  # a bucket workdir: the copy this process writes starts as the bucket's (again
    run.pull()  # since the preflight's pull: another trainer may have written before this one took the lock)
  os.makedirs(run.local, exist_ok=True)
  options = options_lib.validate(config.options.to_dict(), "config.options")
  data = input_lib.make_input(config, run, config.batch_size // jax.process_count())
  if jax.process_index() == 0:
    if not os.path.exists(os.path.join(run.local, CONFIG_FILE)):
      files.write_json(os.path.join(run.local, CONFIG_FILE), config.to_dict())
    run.push(*START_FILES)
  return run, options, data


def record_config(config: ml_collections.ConfigDict, run: Workdir) -> None:
  """config.json: this run's settings, once the restore accepted them (process 0)."""
  if jax.process_index() == 0:
    files.write_json(os.path.join(run.local, CONFIG_FILE), config.to_dict())
    run.push(CONFIG_FILE)


def make_steps(config: ml_collections.ConfigDict, options: dict[str, Any], vocab_size: int
               ) -> tuple[Steps, step_lib.TrainState]:
  """(the mesh over every device, the model, the optimizer, the jitted train and eval steps; the initial state
  placed by its shardings). The state is returned apart: a restored run drops it, and nothing else holds it."""
  mesh = step_lib.make_mesh()
  model = make_model(options, dropout=config.dropout, dtype=config.dtype, unroll=config.scan_unroll)
  optimizer = optimizer_lib.make_optimizer(config)
  num_sampled = config.n_negative_samples if 0 < config.n_negative_samples < vocab_size - 1 else 0

  def create():
    return step_lib.create_train_state(model, optimizer, vocab_size, config.batch_size, config.seed)

  shardings = step_lib.state_shardings(jax.eval_shape(create), mesh, bool(config.shard_softmax))
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
  steps = Steps(mesh, model, optimizer, shardings, train_step, step_lib.make_eval_step(model, mesh, shardings.params),
                num_sampled)
  return steps, jax.jit(create, out_shardings=shardings)()


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
    if source.endswith(init_from.NEW_SOFTMAX + ")") and not config.freeze_bilm_steps:
      released = "no softmax in the release" in source  # EFML, TF-Hub: no vocabulary brings one back
      log.info("init_from gave no softmax for this vocabulary: a random softmax's first gradients reach the "
               "pretrained biLM; consider --config.freeze_bilm_steps=200 (softmax alone first)"
               + ("" if released else ", or --config.data.vocab_file=<the source run's vocab.txt> to keep its "
                  "softmax"))
  # A start from step 0 over an earlier start's records (killed before its first checkpoint, or whose
  # checkpoints were all set aside): they go, as a resume drops those after its step.
  if jax.process_index() == 0 and (dropped := resume.rewind_metrics(run.local, -1)):
    run.push(METRICS_FILE)
    log.info(f"no checkpoint to resume from: dropped the {dropped} metrics.jsonl records of an earlier start")
  return state, None


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
  if base["unigram_ppl"] is None:  # a given vocab_file without its vocab_counts.tsv
    log.info(f"unigram baseline on the eval split: none (the vocabulary has no {VOCAB_COUNTS_FILE}); "
             f"OOV rate {base['oov_rate']:.2%}")
    return
  log.info(f"unigram baseline on the eval split: ppl {base['unigram_ppl']:.1f}, OOV rate {base['oov_rate']:.2%}")


def _dedupe_shards(config, steps: Steps) -> int | None:
  """Batches deduplicated by type for this process's devices (`config.dedupe_tokens`), else None."""
  return len(steps.mesh.local_devices) if config.dedupe_tokens else None


def evaluate(config, data: input_lib.TrainInput, steps: Steps, params) -> dict[str, Any]:
  """One pass over the eval split (full softmax, LSTM state carried from zeros): perplexities, tokens."""
  zero = jax.device_put(zero_state(steps.model.config, config.batch_size), steps.shardings.lstm_state)
  batches = lm_eval.with_progress(data.eval(dedupe_shards=_dedupe_shards(config, steps)),
                                  data.eval_sentences // jax.process_count(), config.eval_max_batches, "eval",
                                  disable=jax.process_index() != 0)
  result = lm_eval.perplexity(steps.eval_step, params, zero, batches, lambda b: device_batch(b, steps.mesh),
                              config.eval_max_batches)
  return {"eval_ppl_forward": result["ppl_forward"], "eval_ppl_backward": result["ppl_backward"],
          "eval_ppl": result["ppl"], "eval_tokens": result["n_tokens"]}


def _log_start(config, data: input_lib.TrainInput, steps: Steps, start_step: int, perf: Throughput) -> None:
  n = config.num_train_steps
  rows = (f"{config.batch_size} ({config.per_device_batch_size} per device)" if config.per_device_batch_size
          else f"{config.batch_size}")
  log.info(f"training {n} steps of {rows} x {config.unroll_steps} tokens on {jax.device_count()} "
           f"device(s) / {jax.process_count()} process(es) from {data.description}; vocab {len(data.vocab):,}; "
           f"{'sampled softmax ' + str(steps.num_sampled) if steps.num_sampled else 'full softmax'}")
  if perf.unknown_chip_line():
    log.info(perf.unknown_chip_line())
  if start_step < config.freeze_bilm_steps:
    log.info(f"biLM frozen for steps {start_step + 1}-{min(config.freeze_bilm_steps, n)}: only the softmax "
             f"trains (config.freeze_bilm_steps={config.freeze_bilm_steps})")


class Pacer:
  """Keeps the host at most `ahead` steps in front of the devices, and times what the devices wait for.

  Queued work stays bounded, and the time the host waits for a batch (`data_wait_share`) is time the
  devices would wait too: when no batch is ready, the devices finish first, so the wait timed next is
  idle device time. Costs nothing: the host could not go on anyway.
  """

  def __init__(self, feed, ahead: int):
    self.feed = feed
    self.ahead = ahead
    self._in_flight: collections.deque = collections.deque()
    self._waited = 0.0  # the feed's wait_sec at the last `wait_share`
    self._since = time.time()

  def next(self):
    if self._in_flight and not self.feed.ready():
      jax.block_until_ready(self._in_flight[-1])
    return self.feed.next()

  def dispatched(self, metrics) -> None:
    self._in_flight.append(metrics)
    if len(self._in_flight) > self.ahead:
      jax.block_until_ready(self._in_flight.popleft())

  def drain(self) -> None:
    """Waits until every dispatched step has finished on the devices (before and after a profile)."""
    while self._in_flight:
      jax.block_until_ready(self._in_flight.popleft())

  def wait_share(self) -> float:
    """Share of the wall time since the last call that the devices waited for a batch."""
    now = time.time()
    share = (self.feed.wait_sec - self._waited) / max(now - self._since, 1e-9)
    self._waited = self.feed.wait_sec
    self._since = now
    return share


def _log_and_eval(config, done: int, started: float, start_step: int, log_window: LogWindow, pacer: Pacer,
                  writer: MetricWriter, eval_now: Callable[[], dict[str, Any]] | None, record: dict,
                  perf: Throughput) -> dict:
  """The log line and record of step `done` and its eval, when due; returns the latest record."""
  last = config.num_train_steps
  if done == config.freeze_bilm_steps and done < last:
    log.info(f"step {done}: biLM unfrozen (config.freeze_bilm_steps={done}); everything trains from here")
  if _every(done, config.log_every_steps, last):
    record = log_window.record(done)
    record = {**record, **perf.fields(record.get("tokens_per_sec")),
              "learning_rate": optimizer_lib.learning_rate_at(config, done),
              "elapsed_sec": time.time() - started, "data_wait_share": pacer.wait_share()}
    writer.write(record)
    if jax.process_index() == 0:
      log.info(progress_line(done, last, record, started, start_step))
  if _every(done, config.eval_every_steps, last) and eval_now is not None:
    log_window.pause()
    result = eval_now()
    writer.write({"step": done, **result})
    log.info(f"step {done}: eval ppl {result['eval_ppl']:.1f} (forward {result['eval_ppl_forward']:.1f}, "
             f"backward {result['eval_ppl_backward']:.1f})")
    record = {**record, **result}
  return record


def _log_done(state, data_state, checkpointer: Checkpointer, run: Workdir) -> None:
  counts = data_state["counters"]
  log.info(f"done: step {int(state.step)}; read {counts['sentences']:,} sentences, {counts['tokens']:,} words "
           f"({counts['truncated_tokens']:,} over-long tokens truncated); checkpoints in {checkpointer.directory}; "
           f"export in {storage.join(run.path, EXPORT_DIR)}", all_processes=True)  # each process's counts differ


def _saver(config: ml_collections.ConfigDict, run: Workdir, checkpointer: Checkpointer, log_window: LogWindow,
           options: dict[str, Any], vocab_sha256: str, train_source: Any) -> Callable[[int, Any, Any], None]:
  """`save(step, state, data_state)`: the checkpoint of `step` (every process), then (process 0) its export."""
  def save(step: int, state: Any, data_state: Any) -> None:
    log_window.pause()  # fetches and checks the pending steps: a checkpoint never holds a non-finite state
    checkpointer.save(step, state, {"data": gather_process_states(data_state), "vocab_sha256": vocab_sha256,
                                    "config": config.to_dict(), "log_window": log_window.sums,
                                    "train_source": train_source})
    if jax.process_index() == 0:
      cancel = checkpointer.deadline(f"the export of step {step}")  # an upload that hangs ends the run too
      try:
        export_model(run.local, state.params, options, config.export_format or "bilm-hdf5")
        run.push(EXPORT_DIR)
      finally:
        cancel()
  return save


def _stopped(stop: StopRequest, checkpointer: Checkpointer, done: int, saved: bool,
             save: Callable[[], None]) -> bool:
  """At a step every process checks at: raises CheckpointSaveError if a save failed; on a stop request
  (SIGTERM/SIGINT here or in another process) saves step `done` (unless just saved), waits for it and says so."""
  checkpointer.check(all_processes=True)
  if not stop.requested():
    return False
  if not saved:
    save()
  checkpointer.wait()  # raises if that save failed
  log.info(f"stopped by {stop.signal_name or 'another process'} after step {done}: saved checkpoint "
           f"{checkpointer.directory}/{done}; run the same command again to resume")
  return True


def _close_run(config: ml_collections.ConfigDict, run: Workdir, checkpointer: Checkpointer, pacer: "Pacer",
               stop: StopRequest, writer: MetricWriter) -> None:
  """Puts back what the loop took, however it ended (a raise included): the feed thread, the signal handlers,
  the writers; a bucket workdir's last metrics uploaded; the last asynchronous save and its checksum awaited."""
  pacer.feed.close()
  stop.restore()
  writer.close()
  run.flush(raise_error=False, timeout_s=config.checkpoint_timeout_s)
  checkpointer.close(raise_error=False)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       after_step: AfterStep | None = None) -> dict[str, Any]:
  """Trains per `config` in `workdir` (a local path or a bucket URL: `training/workdir.py`), resuming if it
  holds a checkpoint; returns the last metrics.

  Resuming is exact: the checkpoint holds the train state (incl. RNG and carried LSTM state), every
  process's data position and the open log window, and metrics.jsonl is rewound to the restored step.
  SIGTERM/SIGINT finish the current step, save and return normally.
  """
  # --- setup ---------------------------------------------------------------------------------------------
  config = variant.resolve(config, workdir)  # the model: options (from init_from), EFML lexicons, export format
  config = with_global_batch(config, jax.device_count())  # before anything is written; raises BatchSizeError
  run, options, data = open_run(config, workdir)
  is_main = jax.process_index() == 0
  n_proc = jax.process_count()
  vocab = data.vocab
  steps, state = make_steps(config, options, len(vocab))
  train_iter = data.train(dedupe_shards=_dedupe_shards(config, steps))

  # --- restore or init -----------------------------------------------------------------------------------
  checkpointer = Checkpointer(run.checkpoints, keep=config.keep_checkpoints, timeout_s=config.checkpoint_timeout_s)
  compatible = lambda meta: resume.check_compatible(meta, config, options, vocab.sha256(), n_proc, run.path)
  state, window_sums = restore_or_init(config, run, checkpointer, state, train_iter, compatible,
                                       steps.optimizer, options, vocab, steps.shardings)
  record_config(config, run)
  start_step = int(state.step)
  last = config.num_train_steps
  data_state = train_iter.get_state()  # the position after the last batch a step consumed
  log_window = LogWindow(window_sums)
  save = _saver(config, run, checkpointer, log_window, options, vocab.sha256(), input_lib.train_source(config.data))
  writer = MetricWriter(run.local, enabled=is_main, purge_step=start_step + 1, config=config.to_dict(),
                        uploaded=run.push_soon if run.remote else None)
  if is_main and data.eval is not None and start_step == 0:
    log_unigram_baseline(config, data, vocab, writer, n_proc)
  perf = Throughput(config, options, len(vocab))
  _log_start(config, data, steps, start_step, perf)
  eval_now = None if data.eval is None else (lambda: evaluate(config, data, steps, state.params))

  def flush():  # for `after_step`: the pending save and the bucket's uploads finished
    checkpointer.wait()
    run.flush()

  # --- the step loop -------------------------------------------------------------------------------------
  started = time.time()
  record = {}
  stop_every = 1 if n_proc == 1 else max(int(config.stop_check_every_steps), 1)
  ahead = max(int(config.prefetch_batches), 1)
  profiler = Profiler(config, run.path, start_step, last)
  pacer = Pacer(make_feed(train_iter, steps.mesh, ahead, stop_every), ahead)
  stop = StopRequest()
  try:  # the handlers, the feed thread and the writers are put back however the loop ends (a raise included)
    for step in range(start_step, last):
      batch, data_state = pacer.next()
      done = step + 1
      # Compiled ahead of its call (the call then finds it in jax's cache): for the prediction and the profile.
      compile_step = lambda: steps.train_step.lower(state, batch).compile()  # noqa: E731
      if step == start_step and is_main and (line := perf.prediction_line(compile_step)):
        log.info(line)
      profiler.before(done, compile_step, pacer.drain)
      state, metrics = steps.train_step(state, batch)
      log_window.add(done, metrics)
      pacer.dispatched(metrics)
      record = _log_and_eval(config, done, started, start_step, log_window, pacer, writer, eval_now, record, perf)
      saved = _every(done, config.checkpoint_every_steps, last)
      if saved:
        save(done, state, data_state)
      profiler.after(done, pacer.drain)
      if after_step is not None:
        after_step(done, flush)
      # Every process asks at the same steps, so all of them stop after the same one (a failed save too).
      if (done % stop_every == 0 or done == last) and _stopped(stop, checkpointer, done, saved,
                                                               lambda: save(done, state, data_state)):
        return record
  finally:
    profiler.close()  # a trace the loop left running (a stop request, an error): written
    _close_run(config, run, checkpointer, pacer, stop, writer)
  checkpointer.check()  # a failed last save, or a failed last upload, is an error of a run that otherwise
  run.flush()  # finished
  _log_done(state, data_state, checkpointer, run)
  return record
