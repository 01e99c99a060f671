"""The train loop, top to bottom: data -> vocab -> sharded state -> steps -> logs, evals, checkpoints, export."""
from __future__ import annotations

import itertools
import math
import os
import time
from typing import Any

import jax
import ml_collections

from elmo_jax import files
from elmo_jax import options as options_lib
from elmo_jax.progress import progress
from elmo_jax.data import TextSource, TfdsSource, Tokenizer, Vocab, make_lm_iterator
from elmo_jax.training import init_from, lm_eval, resume, step as step_lib
from elmo_jax.training.checkpoint import Checkpointer, abstract_like, gather_process_states
from elmo_jax.training.distributed import StopRequest
from elmo_jax.training.export import export_model
from elmo_jax.training.metrics import MetricWriter, progress_line, say


def make_sources(data: ml_collections.ConfigDict):
  """(train, eval) sentence sources from text files or a TFDS dataset; eval may be None."""
  if data.tfds_name:
    kw = dict(data_dir=data.tfds_data_dir or None, text_key=data.tfds_text_key, download=data.tfds_download)
    train = TfdsSource(data.tfds_name, data.tfds_train_split, **kw)
    evals = TfdsSource(data.tfds_name, data.tfds_eval_split, **kw) if data.tfds_eval_split else None
    return train, evals
  if not data.train_files:
    raise ValueError("config.data.train_files is empty and config.data.tfds_name is not set: no training data")
  split = lambda s: [p.strip() for p in s.split(",") if p.strip()]
  train = TextSource(split(data.train_files))
  evals = TextSource(split(data.eval_files)) if data.eval_files else None
  return train, evals


def prepare_vocab(config, workdir: str, train_source, tokenizer: Tokenizer) -> Vocab:
  """The run's vocabulary: the workdir's (resume), else config.data.vocab_file, else built from train."""
  saved = os.path.join(workdir, "vocab.txt")
  if os.path.exists(saved):
    return Vocab.load(saved)
  if config.data.vocab_file:
    vocab = Vocab.load(config.data.vocab_file)
  else:
    started = time.time()
    lines = progress(range(len(train_source)), desc="building vocabulary", unit="line",
                     disable=jax.process_index() != 0)
    vocab = Vocab.build((tokenizer(train_source[i]) for i in lines),
                        max_size=config.data.vocab_max_size, min_count=config.data.vocab_min_count)
    say(f"built vocabulary of {len(vocab):,} tokens from {len(train_source):,} training lines "
        f"in {time.time() - started:.1f}s")
  if jax.process_index() == 0:
    vocab.save(workdir)
  return vocab



def _new_window() -> dict[str, float]:
  """Sums over the steps since the last log line (part of a checkpoint, so resumed averages are exact)."""
  return {"loss_f": 0.0, "loss_b": 0.0, "loss": 0.0, "grad_norm": 0.0, "n": 0, "tok": 0.0, "sec": 0.0}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains per `config` in `workdir`, resuming if it holds a checkpoint; returns the last metrics.

  Resuming is exact: the checkpoint holds the train state (incl. RNG and carried LSTM state), every
  process's data position and the open log window, and metrics.jsonl is rewound to the restored step.
  SIGTERM/SIGINT finish the current step, save and return normally.
  """
  workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  is_main = jax.process_index() == 0
  options = options_lib.validate(config.options.to_dict(), "config.options")
  n_devices, n_proc = jax.device_count(), jax.process_count()
  if config.batch_size % n_devices:
    raise ValueError(f"config.batch_size={config.batch_size} must be divisible by the {n_devices} devices")

  tokenizer = Tokenizer(pretokenized=config.data.pretokenized)
  train_source, eval_source = make_sources(config.data)
  for name, source in (("train", train_source), ("eval", eval_source)):
    skipped = {k: v for k, v in getattr(source, "skipped", {}).items() if v}
    if skipped:  # bad lines never stop a run, but the user should know they were dropped
      first = getattr(source, "first_skipped", {})
      say(f"{name} data: skipped " + ", ".join(
          f"{n:,} {reason} lines" + (f" (first at {first[reason]})" if reason in first else "")
          for reason, n in skipped.items()))
  vocab = prepare_vocab(config, workdir, train_source, tokenizer)
  if is_main:
    files.write_json(os.path.join(workdir, "config.json"), config.to_dict())

  mesh = step_lib.make_mesh()
  model = step_lib.make_model(options, config)
  optimizer = step_lib.make_optimizer(config)
  num_sampled = config.n_negative_samples if 0 < config.n_negative_samples < len(vocab) - 1 else 0
  create = lambda: step_lib.create_train_state(model, optimizer, len(vocab), config.batch_size, config.seed)
  shardings = step_lib.state_shardings(jax.eval_shape(create), mesh)
  state = jax.jit(create, out_shardings=shardings)()
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
  eval_step = step_lib.make_eval_step(model, mesh, shardings)
  dedupe = bool(config.get("dedupe_tokens", False))
  to_global = lambda b: step_lib.global_batch(b, mesh, dedupe=dedupe)

  local_rows = config.batch_size // n_proc
  train_iter = make_lm_iterator(train_source, vocab, tokenizer, batch_size=local_rows,
                                unroll_steps=config.unroll_steps, seed=config.seed,
                                max_token_chars=config.data.max_token_chars,
                                shard=config.data.get("shard", "sentences"))
  # Resume if the workdir has a good checkpoint (bad newest steps are set aside), else maybe init_from.
  checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=config.keep_checkpoints)
  compatible = lambda meta: resume.check_compatible(meta, config, options, vocab.sha256(), n_proc, workdir)
  restored = checkpointer.restore(abstract_like(state), compatible)
  window = _new_window()
  if restored is not None:
    restored_step, state, meta = restored
    train_iter.set_state(meta["data"][jax.process_index()])
    window = meta.get("log_window", window)
    dropped = resume.rewind_metrics(workdir, restored_step) if is_main else 0
    say(f"resumed from step {restored_step} in {checkpointer.directory}"
        + (f" (dropped {dropped} metrics.jsonl records written after it)" if dropped else ""))
  elif config.init_from:
    state, source = init_from.apply(config.init_from, state, options, vocab.sha256(), optimizer, shardings)
    say(f"initialised from {source}; fresh optimizer")
  start_step = int(state.step)

  def eval_batches(**shard):
    return make_lm_iterator(eval_source, vocab, tokenizer, batch_size=local_rows,
                            unroll_steps=config.unroll_steps, seed=config.seed, shuffle=False, num_epochs=1,
                            max_token_chars=config.data.max_token_chars, **shard)

  def run_eval(params) -> dict[str, Any]:
    if eval_source is None:
      return {}
    zero = jax.device_put(model.zero_state(config.batch_size), shardings.lstm_state)
    batches = lm_eval.with_progress(eval_batches(), len(eval_source) // n_proc, config.eval_max_batches,
                                    "eval", disable=not is_main)
    result = lm_eval.perplexity(eval_step, params, zero, batches, to_global, config.eval_max_batches)
    return {"eval_ppl_forward": result["ppl_forward"], "eval_ppl_backward": result["ppl_backward"],
            "eval_ppl": result["ppl"], "eval_tokens": result["n_tokens"]}

  def save(step: int) -> None:
    checkpointer.save(step, state, {"data": gather_process_states(train_iter.get_state()),
                                    "vocab_sha256": vocab.sha256(), "config": config.to_dict(),
                                    "log_window": window})
    if is_main:
      export_model(workdir, state.params, options)

  writer = MetricWriter(workdir, enabled=is_main, purge_step=start_step + 1, config=config.to_dict())
  if is_main and eval_source is not None and start_step == 0:
    # Process 0 reads every shard; with one process these are exactly the targets the biLM's eval scores
    # (several processes: the same number of batch rows, drawn from the unsharded split).
    batches = eval_batches(process_index=0, process_count=1)
    if config.eval_max_batches:
      batches = itertools.islice(batches, config.eval_max_batches * n_proc)
    base = lm_eval.unigram_baseline(vocab, batches)
    writer.write({"step": 0, **base})
    say(f"unigram baseline on the eval split: ppl {base['unigram_ppl']:.1f}, OOV rate {base['oov_rate']:.2%}")
  say(f"training {config.num_train_steps} steps of {config.batch_size} x {config.unroll_steps} tokens on "
      f"{n_devices} device(s) / {n_proc} process(es); vocab {len(vocab):,}; "
      f"{'sampled softmax ' + str(num_sampled) if num_sampled else 'full softmax'}")

  started = time.time()
  record: dict[str, Any] = {}
  stop = StopRequest()
  try:  # the handlers are put back however the loop ends (a raise included)
    for step in range(start_step, config.num_train_steps):
      step_started = time.time()
      batch = next(train_iter)
      state, metrics = train_step(state, to_global(batch))
      metrics = jax.device_get(metrics)
      if step > start_step:  # tokens/s counts data + step time only: not compiling, evals or saves
        window["tok"] += float(metrics["n_tokens"])
        window["sec"] = window.get("sec", 0.0) + time.time() - step_started
      if not math.isfinite(float(metrics["loss"])):
        raise FloatingPointError(f"non-finite loss {float(metrics['loss'])} at step {step + 1}; nothing was saved "
                                 "for this step (lower config.learning_rate or use config.grad_clip)")
      for key, name in (("loss_f", "loss_forward"), ("loss_b", "loss_backward"), ("loss", "loss"),
                        ("grad_norm", "grad_norm")):
        window[key] += float(metrics[name])
      window["n"] += 1
      done = step + 1
      if done % config.log_every_steps == 0 or done == config.num_train_steps:
        n, now = window["n"], time.time()
        record = {"step": done, "train_loss": window["loss"] / n,
                  "train_ppl_forward": math.exp(window["loss_f"] / n),
                  "train_ppl_backward": math.exp(window["loss_b"] / n),
                  "learning_rate": step_lib.learning_rate_at(config, done), "grad_norm": window["grad_norm"] / n,
                  "tokens_per_sec": window["tok"] / max(window.get("sec", 0.0), 1e-9),
                  "elapsed_sec": now - started}
        writer.write(record)
        if is_main:
          say(progress_line(done, config.num_train_steps, record, started, start_step))
        window = _new_window()
      if done % config.eval_every_steps == 0 or done == config.num_train_steps:
        result = run_eval(state.params)
        if result:
          writer.write({"step": done, **result})
          say(f"step {done}: eval ppl {result['eval_ppl']:.1f} (forward {result['eval_ppl_forward']:.1f}, "
              f"backward {result['eval_ppl_backward']:.1f})")
          record = {**record, **result}
      saved = done % config.checkpoint_every_steps == 0 or done == config.num_train_steps
      if saved:
        save(done)
      if stop.requested():  # every process asks at every step, so all of them stop after the same one
        if not saved:
          save(done)
        checkpointer.close()
        writer.close()
        say(f"stopped by {stop.signal_name or 'another process'} after step {done}: saved checkpoint "
            f"{checkpointer.directory}/{done}; run the same command again to resume")
        return record
  except BaseException:
    checkpointer.close()  # let the previous step's asynchronous save finish; never leave it half-written
    writer.close()
    raise
  finally:
    stop.restore()
  checkpointer.close()  # waits for the last asynchronous save and its checksum
  writer.close()
  counts = train_iter.counters
  say(f"done: step {int(state.step)}; read {counts['sentences']:,} sentences, {counts['tokens']:,} words "
      f"({counts['truncated_tokens']:,} over-long tokens truncated); checkpoints in {checkpointer.directory}; "
      f"export in {workdir}/export")
  return record
