"""The HDF5 writer of the embedding command (`elmo_jax/cli/embed.py`, whose docstring gives the output layout):
`embed_file` streams a file of sentences through an `Embedder` into AllenNLP's `elmo` layout.

Unlike AllenNLP, an empty line is not an error: it gets a `(n_layers + 1, 0, 2P)` entry and a warning.
The file is streamed in chunks, so memory stays bounded; within a chunk the `Embedder`'s length bucketing
and token dedupe apply, on all of the process's devices. The work goes through the job folder
`OUTPUT.partial/` (`elmo_jax.embedding.job`): parts of each chunk are committed as they are written, a rerun of
the same command after a failure, a signal or `kill -9` continues after the last one, and with several
processes each embeds its share of the chunks. Process 0 merges the parts into a temp file next to the
output and renames it at the end, so no reader ever sees a half-written output; temp files are removed on
failure and SIGTERM, and one left by a writer killed outright is removed by the next run for that output.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, TextIO

import h5py
from absl import logging

from elmo_jax.data import chars
from elmo_jax.data.vocab import Vocab
from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding import parts
from elmo_jax.embedding import space
from elmo_jax.runtime import files
from elmo_jax.embedding.inputs import (ACTIVE_JOBS, ACTIVE_TEMPS, EmbedInputError, InputLines, JobInput,
                                      check_output_path, read_lines)
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.formats import tfhub

def embed_file(embedder: Embedder, input_file: str | os.PathLike | JobInput, output_file: str | os.PathLike,
               batch_size: int | None = None, *, chunk_size: int = 4096, part_sentences: int | None = None,
               progress_every: float | None = 5.0, progress_stream: TextIO | None = None,
               warn: Callable[[str], Any] = logging.warning, output: str | list[float] = "all",
               sentence_vectors: bool = False, output_dtype: str = "float32", use_sentence_keys: bool = False,
               forget_sentences: bool = False, tokenize: Callable[[str], list[str]] | None = None,
               process_index: int | None = None, process_count: int | None = None) -> dict[str, Any]:
  """Embeds every line of `input_file` into `output_file` (HDF5, AllenNLP `elmo` layout); resumable.

  The work goes through the job folder `output_file.partial/` (`elmo_jax.embedding.job`): a rerun of the same
  call after a failure, a signal or `kill -9` skips the finished parts and gives the same file; with
  several processes (`jax.distributed`), each embeds its share of the lines and process 0 writes the file.

  Args:
    embedder: the model; its `stateful` flag decides the batching (see `Embedder`).
    input_file: UTF-8 text, one whitespace-tokenized sentence per line (gzip too; a pipe, FIFO or `-` is
      spooled into the job folder), or `embed_files.check_job`'s `JobInput` (the command checks its job
      once, before it loads the model).
    output_file: HDF5 to write; replaced only once everything succeeded.
    batch_size: sentences per batch (None: `embedder.default_batch_size`, 64 per device).
    chunk_size: lines read at once; rounded up to whole batches (stateful batches: the same groups of lines).
    part_sentences: sentences per part file (whole batches; None: 8 batches): what a kill can lose.
    progress_every, progress_stream: seconds between progress lines (None: none), and where (stderr).
    warn: called with a message for empty lines and cut tokens.
    output: "all", "top", "average", one weight per layer (their weighted sum) or a TF-Hub module's output
      (`tfhub.OUTPUTS`); shapes: `cli/embed.py`.
    sentence_vectors: write the mean over each line's tokens instead.
    output_dtype: "float32" or "float16".
    use_sentence_keys, forget_sentences: name datasets by the line (AllenNLP); no `sentence_to_index`.
    tokenize: `str -> tokens` for raw text (default: split on whitespace).
    process_index, process_count: this process's share (default: JAX's process index and count).

  Returns:
    {"lines", "sentences" (this process, this run), "resumed" (earlier runs'), "tokens", "empty_lines",
     "long_tokens", "seconds", "wrote" (whether this process wrote the output)}.

  Raises:
    EmbedInputError (one line): a bad input (names the line), an output that would destroy an input
    (`EmbedOutputError`), a job folder of another run (`embed_job.JobError`), `--stateful` over processes.
  """
  output_file = os.fspath(output_file)
  batch_size, process_index, process_count = _checked_args(embedder, batch_size, output, output_dtype,
                                                           process_index, process_count)
  if not isinstance(input_file, JobInput):  # the job's checks, once (the command made them before loading)
    input_file = embed_files.check_job(input_file, output_file, embedder.input_files, warn)
  fmt = parts.Format(output, sentence_vectors, output_dtype, use_sentence_keys,
                     embedder.module_mix if output in tfhub.OUTPUTS[3:] else None)
  job = _open_job(embedder, input_file, output_file, fmt, tokenize, not (use_sentence_keys or forget_sentences),
                  (batch_size, chunk_size, part_sentences), process_index)
  index_from = None if use_sentence_keys or forget_sentences else input_file  # sentence_to_index's lines
  try:
    with space.named(job):  # a full disk: one line naming the folder and the room the job needs
      share = job.layout.share(process_index, process_count)
      job.verified_parts([(c, g) for c in share for g in range(job.layout.parts(c))], warn)
      progress = _progress(job, output_file, warn, progress_every if process_index == 0 else None,
                           progress_stream, process_count > 1)
      lines = InputLines(input_file.source, input_file.path, _cut(embedder), warn)
      return _run_job(embedder, job, fmt, lines, progress, tokenize, (process_index, process_count), output_file,
                      index_from)
  finally:
    job.release()


# A TF-Hub module computes its outputs for each call from a zero state; --stateful's would be other numbers.
STATEFUL_MODULE_OUTPUT = ("--module_output={} is what the TF-Hub module computes for each batch from a zero state; "
                          "--stateful carries the LSTM state between batches, which the module does not, so the "
                          "output would differ from the module's: drop --stateful, or use --all/--top/--average")


def _cut(embedder: Embedder) -> tuple[Any, str]:
  """(token -> whether the model's char ids cut it, the cut in words): bilm-tf's ids keep 48 UTF-8 bytes
  (`chars.is_cut`), an ELMoForManyLangs lexicon its code points (`LexiconIds.is_cut`)."""
  if embedder.token_ids is not None:
    return embedder.token_ids.is_cut, f"{embedder.token_ids.max_chars - 2} characters"
  width = embedder.config.max_characters_per_token
  return (lambda token: chars.is_cut(token, width)), f"{width - 2} UTF-8 bytes"


def _checked_args(embedder: Embedder, batch_size: int | None, output: str | list[float], output_dtype: str,
                  process_index: int | None, process_count: int | None) -> tuple[int, int, int]:
  """`embed_file`'s checks of its arguments before any work, in order; returns the batch size and this
  process's index and count (None: JAX's)."""
  batch_size = embedder.default_batch_size if batch_size is None else batch_size
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if isinstance(output, list):  # a mix: one weight per layer
    parts.check_weights(output, embedder.n_layers)
  elif output not in ("all", "top", "average", *tfhub.OUTPUTS):
    raise ValueError(f"output must be all/top/average, one weight per layer or a TF-Hub module's "
                     f"{'/'.join(tfhub.OUTPUTS)}, got {output!r}")
  if output_dtype not in ("float32", "float16"):
    raise ValueError(f"output_dtype must be float32 or float16, got {output_dtype!r}")
  if output in tfhub.OUTPUTS and embedder.stateful:
    raise EmbedInputError(STATEFUL_MODULE_OUTPUT.format(output))
  if output in tfhub.OUTPUTS[3:] and embedder.module_mix is None:
    raise EmbedInputError(f"'{output}' is a TF-Hub module's learned mix of the layers; this model has none "
                          "(give the module's folder as the model)")
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index, process_count = jax.process_index(), jax.process_count()
  if embedder.stateful and process_count > 1:
    raise EmbedInputError(f"--stateful carries each batch row's state through the input in order, so it runs "
                          f"in one process (this job has {process_count})")
  return batch_size, process_index, process_count


def _open_job(embedder: Embedder, job_input: JobInput, output_file: str, fmt: parts.Format,
              tokenize: Callable[[str], list[str]] | None, sentence_to_index: bool,
              sizes: tuple[int, int, int | None], process_index: int) -> embed_job.Job:
  """The job folder of this run, locked for this process (created, or an earlier run's to resume:
  `embed_job.Job.open` checks that its settings are these: the input's lines and sha256 from `check_job`'s
  one pass), a spooled input moved in (`JobInput.adopt`), an earlier failure report of this process
  cleared. `sizes`: batch_size, chunk_size, part_sentences."""
  batch_size, chunk_size, part_sentences = sizes
  for name, value in (("chunk_size", chunk_size), ("part_sentences", part_sentences)):  # before any read
    if value is not None and value < 1:
      raise ValueError(f"{name} must be >= 1, got {value}")
  if fmt.use_sentence_keys:
    embed_files.check_sentence_keys(job_input.path, job_input.source)
  layout = embed_job.Layout(job_input.lines, -(-chunk_size // batch_size) * batch_size, batch_size,
                            -(-part_sentences // batch_size) if part_sentences else embed_job.DEFAULT_PART_BATCHES)
  settings = {"input": {"lines": job_input.lines, "sha256": job_input.sha256},
              "model": embedder.fingerprint(), "devices": len(embedder.devices),
              "layout": dataclasses.asdict(layout), "format": dataclasses.asdict(fmt),
              "tokenize": None if tokenize is None else type(tokenize).__name__,
              "sentence_to_index": sentence_to_index}
  try:
    job = embed_job.Job.open(output_file, settings, layout, process_index)  # locked: one command per job
  except BaseException:
    job_input.discard()
    raise
  job.input_bytes = job_input.bytes
  try:
    job_input.adopt(job.folder)
    job.clear_failure(process_index)  # an earlier run's report of this process
  except BaseException:
    job.release()
    raise
  return job


def _progress(job: embed_job.Job, output_file: str, warn: Callable[[str], Any], every: float | None,
              stream: TextIO | None, poll: bool) -> embed_job.Progress:
  """The job's progress lines, counting what earlier runs finished (said once: resuming); `poll`: count
  every process's committed parts, not this process's batches."""
  resumed = job.done_counts()
  if resumed[0]:
    warn(f"{output_file}: resuming; {resumed[0]} of {job.layout.lines} lines are already embedded in {job.folder}")
  return embed_job.Progress(job.layout.lines, every, stream, done=resumed, poll=job.done_counts if poll else None)


def _run_job(embedder: Embedder, job: embed_job.Job, fmt: parts.Format, lines: InputLines,
             progress: embed_job.Progress, tokenize: Callable[[str], list[str]] | None,
             process: tuple[int, int], output_file: str, index_from: JobInput | None) -> dict[str, Any]:
  """Embeds this process's share of `job` (a failure on a process other than 0 is recorded for process 0);
  process 0 then waits for every part and writes the output. Returns `embed_file`'s stats."""
  index, count = process
  ACTIVE_JOBS.add(job.folder)
  try:
    try:
      _embed_share(embedder, job, lines, parts.PartWriter(job, fmt, lines.input_file, lines.warn), progress,
                   tokenize,
                   job.layout.share(index, count))
    except BaseException as e:
      if index > 0:
        job.record_failure(index, e)
      raise
    lines.finish()
    if index == 0:
      job.wait_for_all(on_poll=progress.update)
      progress.finish()
      _write_output(job, output_file, index_from)
  finally:
    ACTIVE_JOBS.discard(job.folder)
  return {"lines": job.layout.lines, "sentences": progress.sentences, "resumed": progress.done[0],
          "tokens": progress.tokens, "empty_lines": len(lines.empty), "long_tokens": lines.long_tokens,
          "seconds": time.perf_counter() - progress.start, "wrote": index == 0}


def _embed_share(embedder: Embedder, job: embed_job.Job, lines: InputLines, writer: parts.PartWriter,
                 progress: embed_job.Progress, tokenize: Callable[[str], list[str]] | None,
                 share: range) -> None:
  """Reads this process's chunks, embeds their unfinished parts with `Embedder.batches` and hands the
  batches to `writer`, committing each part after its last batch.

  The batches are `embed_sentences`' (a short last batch padded to a power of two of rows), so the CLI
  compiles no shape the library would not, and a chunk's last batch costs no more than its sentences need.
  Stateful, the finished parts are the ones before the first unfinished part, and the state continues
  from the last of them.
  """
  layout, todo = job.layout, _unfinished(job, embedder, share)
  try:
    for c, chunk in enumerate(embed_files.chunks(read_lines(lines.path, lines.input_file), layout.chunk_size)):
      if c >= share.stop:
        break
      if c not in todo:
        continue
      sentences = [lines.tokens(i, text, tokenize) for i, text in chunk]
      n_batches = -(-len(chunk) // layout.batch_size)
      for k, rows, layers, state in embedder.batches(
          sentences, layout.batch_size, fresh_every=layout.part_batches,
          skip=lambda k, c=c: k // layout.part_batches not in todo[c]):
        writer.put(layers, [(*chunk[pos], len(sentences[pos])) for pos in rows])
        progress.update(len(rows), sum(len(sentences[pos]) for pos in rows))
        if k % layout.part_batches == layout.part_batches - 1 or k == n_batches - 1:
          writer.commit((c, k // layout.part_batches), state)
  except BaseException:
    writer.close(abort=True)
    raise
  writer.close()


def _unfinished(job: embed_job.Job, embedder: Embedder, share: range) -> dict[int, set[int]]:
  """{chunk: its parts still to embed} of `share`; stateful, also restores the state to continue from."""
  parts = [(c, g) for c in share for g in range(job.layout.parts(c))]
  done = job.done_parts(parts)
  if embedder.stateful:
    first = next((i for i, p in enumerate(parts) if p not in done), len(parts))
    embedder.state = job.state_after(parts[first - 1]) if first else None
    todo = parts[first:]
  else:
    todo = [p for p in parts if p not in done]
  out: dict[int, set[int]] = {}
  for c, g in todo:
    out.setdefault(c, set()).add(g)
  return out


def _write_output(job: embed_job.Job, output_file: str, index_from: JobInput | None) -> None:
  """Process 0, once every part is committed: the parts checked (`Job.check_parts`) and merged into the
  output (atomically, if it has room: `space.check_room`), then the job folder removed. `index_from`: the
  input, whose lines make `sentence_to_index`."""
  job.check_parts()
  index = None if index_from is None else json.dumps(
      {text: str(i) for i, text in read_lines(index_from.path, index_from.source)})
  space.check_room(job, 0 if index is None else len(index.encode()))
  with space.named(job, merging=True), files.atomic_path(output_file,
                                                         prefix=embed_files.temp_prefix(output_file)) as tmp:
    ACTIVE_TEMPS.add(tmp)
    try:
      with h5py.File(tmp, "w") as fout:
        job.merge(fout)
        if index is not None:  # later duplicates win, as in AllenNLP
          fout.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))[0] = index
    finally:
      ACTIVE_TEMPS.discard(tmp)
  job.remove()


def dump_token_embeddings(embedder: Embedder, vocab_file: str | os.PathLike, output_file: str | os.PathLike,
                          batch_size: int = 4096) -> int:
  """bilm-tf's `dump_token_embeddings`: the char-CNN output of every word of `vocab_file`; returns the count."""
  if os.path.exists(vocab_file) and not embed_files.is_stream(os.fspath(vocab_file)):  # a pipe is read once
    problem = files.text_problem(vocab_file)
    if problem is not None:
      raise EmbedInputError(f"{os.fspath(vocab_file)}: {problem}")
  check_output_path(output_file, [vocab_file, *embedder.input_files])
  try:
    tokens = Vocab.load(os.fspath(vocab_file), require_specials=False).tokens
  except (FileNotFoundError, ValueError) as e:
    raise EmbedInputError(str(e)) from None
  embedder.dump_token_embeddings(tokens, output_file, batch_size)
  return len(tokens)
