"""ELMo on a Ray cluster (Ray Data): actors that each load a warm `Embedder` once and keep it, in a person's own
pipeline (`EmbedBatches`) or as `elmo-jax embed --engine=ray` (`embed_corpus`: shards of a corpus, written by
the actors, resumable). Ray schedules, retries a task whose actor died and moves the data; this module supplies
the model step. Needs the ray extra (`pip install 'elmo_jax[ray]'`).

    import ray
    from elmo_jax.engines.ray_data import EmbedBatches
    ds = ray.data.read_text("corpus/*.txt")                     # a "text" column, a line a row
    ds = ds.map_batches(EmbedBatches, fn_constructor_kwargs={"model": "small", "output": "average"},
                        compute=ray.data.ActorPoolStrategy(size=4), batch_size=256)
    ds.write_parquet("out/")                                    # text, embedding [n_tokens, 2P] a row

GPUs: `num_gpus=1` per actor in `map_batches`; actors that share a device (`num_gpus=0.5`) allocate GPU memory
as they need it rather than JAX's default of most of the device (`XLA_PYTHON_CLIENT_PREALLOCATE=false`, set
in each actor unless the environment sets it).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any, Sequence, TextIO

import numpy as np

from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.embedding import inputs as embed_inputs
from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding import parts
from elmo_jax.embedding.embedder import DEFAULT_BATCH_SIZE, Embedder
from elmo_jax.engines import corpus
from elmo_jax.engines import shard_files
from elmo_jax.engines import worker
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.sources import download
from elmo_jax.sources import loaded
from elmo_jax.sources import resolve


# What a worker raises for the user's input or model: the command prints it as one line.
USER_ERRORS = (corpus.CorpusError, shard_files.JobFolderError, embed_inputs.EmbedInputError, download.DownloadError,
               options_lib.OptionsError, weights_lib.WeightFileError, OSError)


class WorkerError(RuntimeError):
  """What a worker met of the user's input or model (`USER_ERRORS`), its one line brought to the driver."""


def _load(model: str, devices: int | None, warm: bool) -> Embedder:
  """The actor's Embedder, once: from any spec `resolve_model` takes (a released name, hf://, a folder, a run)."""
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before JAX opens a GPU: actors may share it
  return Embedder.from_pretrained(model, devices=devices, warm=warm)


class EmbedBatches:
  """A callable class for `ray.data.Dataset.map_batches`: each actor loads the model once (`__init__`), each
  call embeds a batch's lines and returns the batch with the chosen output added.

  Args:
    model: any spec `elmo-jax embed --model` takes.
    output: `layers` `[n_layers + 1, n_tokens, 2P]`, `top`, `average` or `mix` `[n_tokens, 2P]`
      (`worker.output_format`).
    mix: with `output="mix"`, one weight per layer.
    sentence_vectors: the mean of the output over the tokens instead.
    dtype: float32 or float16.
    text_column: the column of lines (whitespace-tokenized, or raw with `tokenize`).
    output_column: the column added.
    tokenize: tokenize raw text with the trainer's Moses tokenizer.
    batch_size: sentences per device batch inside the actor (default: the Embedder's, 64 per device).
    devices: the actor's local devices to use (default all that Ray gave it); warm: compile every shape at load.
  """

  def __init__(self, model: str, output: str = "average", mix: Sequence[float] | None = None,
               sentence_vectors: bool = False, dtype: str = "float32", text_column: str = "text",
               output_column: str = "embedding", tokenize: bool = False, batch_size: int | None = None,
               devices: int | None = None, warm: bool = False):
    self.fmt = worker.output_format(output, mix, sentence_vectors, dtype)
    self.embedder = _load(model, devices, warm)
    worker.check_mix(self.embedder, self.fmt)
    self.text_column, self.output_column, self.batch_size = text_column, output_column, batch_size
    self.tokenize = Tokenizer() if tokenize else None

  def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`batch` (Ray's numpy format) with `output_column` added: one array a row (same shapes: stacked)."""
    if self.text_column not in batch:
      raise KeyError(f"EmbedBatches: the batch has no column {self.text_column!r} (its columns: "
                     f"{', '.join(batch)}); give text_column=")
    texts = [str(t) for t in batch[self.text_column]]
    sentences = [self.tokenize(t) if self.tokenize is not None else t.split() for t in texts]
    outputs = worker.embed_lines(self.embedder, sentences, self.fmt, lambda i: f"row {i} of the batch",
                                 self.batch_size)
    if len({o.shape for o in outputs}) == 1:
      column = np.stack(outputs)
    else:  # a ragged column (Ray's variable-shaped tensors)
      column = np.empty(len(outputs), object)
      column[:] = outputs
    return {**batch, self.output_column: column}


class EmbedShards:
  """The actor of `embed_corpus`: loads the model once, then embeds and writes whole shards
  (`worker.ShardWorker`); a row in is a shard (as JSON), a row out its record (as JSON).

  An error of the user's input or model (`USER_ERRORS`: a model that cannot be loaded, a float16 overflow) comes
  back as the record's one-line "error", which the driver raises: a raised one would reach it wrapped in Ray's
  exceptions, its message inside their tracebacks, after Ray retried the shard for nothing."""

  def __init__(self, model: str, fmt: dict[str, Any], output_dir: str, output_format: str, settings_sha: str,
               chunk_size: int, batch_size: int | None, tokenize: bool, max_tokens: int | None, on_bad_line: str):
    self.worker, self.error = None, None
    try:
      embedder = _load(model, None, False)
      self.worker = worker.ShardWorker(embedder, parts.Format(**fmt), output_dir, output_format, settings_sha,
                                       chunk_size, batch_size, Tokenizer() if tokenize else None, max_tokens,
                                       on_bad_line)
    except USER_ERRORS as e:
      self.error = f"{type(e).__name__}: {e}"

  def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    records = [self._run(corpus.Shard(**json.loads(str(s)))) for s in batch["shard"]]
    return {"record": np.array([json.dumps(r) for r in records], object)}

  def _run(self, shard: corpus.Shard) -> dict[str, Any]:
    if self.error is None:
      try:
        return self.worker.run(shard)
      except USER_ERRORS as e:
        return {"shard": shard.number, "error": str(e)}
    return {"shard": shard.number, "error": self.error}


@dataclasses.dataclass
class Cluster:
  """Where and how wide: `address` (None: start a local cluster on this machine), `actors` in the pool, each
  with `actor_cpus` CPUs and `actor_gpus` GPUs (a fraction shares one)."""
  address: str | None = None
  actors: int = 1
  actor_cpus: float = 1.0
  actor_gpus: float = 0.0


def embed_corpus(model: str, inputs: Sequence[str], output_dir: str, *, cluster: Cluster = Cluster(),
                 output: str = "layers", mix: Sequence[float] | None = None, sentence_vectors: bool = False,
                 dtype: str = "float32", output_format: str = "parquet", batch_size: int | None = None,
                 chunk_size: int = 4096, shard_lines: int | None = None, tokenize: bool = False,
                 max_tokens: int | None = None, on_bad_line: str = "stop", progress_every: float | None = 5.0,
                 stream: TextIO | None = None) -> dict[str, Any]:
  """Embeds every line of `inputs` (paths, `gs://` URLs, globs; gzip too) into shards in `output_dir`
  (`shard_files`) on a Ray cluster; a rerun of the same call skips the shards already written and checked.

  A shard holds `shard_lines` lines (default: one chunk, `chunk_size` lines rounded up to whole batches of
  `batch_size`, 64 sentences) and is embedded as `elmo-jax embed` embeds the same chunk of the same file.
  Bad lines (not UTF-8, over `max_tokens`): `on_bad_line="stop"` stops the job at the first, naming its file
  and line (lines that are not UTF-8 before anything is embedded); `"skip"` leaves them out of the shards and
  lists each in the manifest and on `stream`.

  Returns the manifest (`shard_files.write_manifest`) with "seconds", "embedded_shards" and "skipped_shards".
  Raises `corpus.CorpusError` / `shard_files.JobFolderError` (one line) for a bad input or output folder.
  """
  # Ray Data's INFO lines (each dataset's start and end) off unless asked for: the job prints its own progress
  os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")
  import ray  # pylint: disable=g-import-not-at-top  (the ray extra)
  stream = stream if stream is not None else sys.stderr
  fmt = worker.output_format(output, mix, sentence_vectors, dtype)
  if on_bad_line not in worker.ON_BAD_LINE or output_format not in shard_files.FORMATS:
    raise ValueError(f"on_bad_line must be stop/skip and output_format parquet/hdf5, got {on_bad_line!r}, "
                     f"{output_format!r}")
  batch = batch_size or DEFAULT_BATCH_SIZE  # an actor's one device, as the embed command's on one
  chunk = -(-chunk_size // batch) * batch  # the embed command's chunk: whole batches
  shard_lines = shard_lines or chunk
  if shard_lines % chunk:
    raise ValueError(f"shard_lines={shard_lines} must be a multiple of the chunk, {chunk} lines")
  # Ray's workers run in folders of their own: a local path is made absolute here, where the user named it (on a
  # cluster of several nodes, local paths must be on a filesystem every node mounts; gs:// URLs need nothing).
  paths = [p if storage.is_remote(p) else os.path.abspath(p) for p in corpus.expand(inputs)]
  output_dir = output_dir if storage.is_remote(output_dir) else os.path.abspath(output_dir)
  shard_files.check_folder(output_dir, paths)  # before anything is scanned
  start = time.perf_counter()
  identity = _model_identity(model, fmt)
  _init_ray(ray, cluster.address)
  files_ = _scan(ray, paths, shard_lines, on_bad_line)
  settings = _settings(identity, fmt, output_format, batch, chunk, shard_lines, tokenize, max_tokens, on_bad_line,
                       files_)
  settings_sha = files.sha256_arrays(extra=settings)
  shard_files.open_job(output_dir, settings)
  shards = corpus.shards(files_, shard_lines)
  done = shard_files.written(output_dir, shards, settings_sha, output_format)
  todo = [s for s in shards if s.number not in done]
  progress = embed_job.Progress(sum(f.lines for f in files_), progress_every, stream,
                                done=(sum(r["lines"] for r in done.values()), sum(r["tokens"] for r in done.values())))
  if done:
    stream.write(f"{output_dir}: resuming; {len(done)} of {len(shards)} shards are already written and checked\n")
  records = dict(done)
  if todo:
    actor = {"model": model, "fmt": dataclasses.asdict(fmt), "output_dir": output_dir, "output_format": output_format,
             "settings_sha": settings_sha, "chunk_size": chunk, "batch_size": batch, "tokenize": tokenize,
             "max_tokens": max_tokens, "on_bad_line": on_bad_line}
    for record in _embed_shards(ray, todo, cluster, actor):
      for index, path, line, why in record["bad_lines"]:
        if on_bad_line == "stop":
          raise corpus.CorpusError(f"{path}:{line + 1}: {why} ({_SKIP_HINT})")
        stream.write(f"{path}:{line + 1}: skipped line {index}: {why}\n")
      records[record["shard"]] = record
      progress.update(record["lines"], record["tokens"])
  progress.finish()
  manifest = shard_files.write_manifest(output_dir, settings, list(records.values()))
  return {**manifest, "seconds": time.perf_counter() - start, "embedded_shards": len(todo),
          "skipped_shards": len(done), "embedded_tokens": progress.tokens}


_SKIP_HINT = "--on_bad_line=skip leaves such lines out and lists them"


def _scan(ray, paths: Sequence[str], shard_lines: int, on_bad_line: str) -> list[corpus.InputFile]:
  """Every input scanned once, a Ray task a file (`corpus.scan`); with `stop`, CorpusError at the first line that
  is not UTF-8, before anything is embedded."""
  scan = ray.remote(num_cpus=1)(corpus.scan)
  try:
    files_ = corpus.input_files(ray.get([scan.remote(p, shard_lines) for p in paths]))
  except ray.exceptions.RayTaskError as e:  # a missing or damaged file: its one line, not the task's traceback
    if isinstance(e.cause, USER_ERRORS):
      raise e.cause from None
    raise
  bad = [(f.path, line, why) for f in files_ for line, why in f.bad]
  if bad and on_bad_line == "stop":
    path, line, why = bad[0]
    raise corpus.CorpusError(f"{path}:{line + 1}: {why} ({_SKIP_HINT})")
  return files_


def _embed_shards(ray, todo: Sequence[corpus.Shard], cluster: Cluster, actor: dict[str, Any]):
  """Yields each shard's record as the actor pool (`EmbedShards(**actor)`) finishes it; WorkerError for the one
  line of an actor's error."""
  ds = ray.data.from_items([{"shard": json.dumps(dataclasses.asdict(s))} for s in todo], override_num_blocks=len(todo))
  ds = ds.map_batches(EmbedShards, batch_size=1, batch_format="numpy", fn_constructor_kwargs=actor,
                      compute=ray.data.ActorPoolStrategy(size=cluster.actors), num_cpus=cluster.actor_cpus,
                      num_gpus=cluster.actor_gpus)
  for row in ds.iter_rows():
    record = json.loads(row["record"])
    if "error" in record:
      raise WorkerError(record["error"])
    yield record


def _model_identity(model: str, fmt: parts.Format) -> dict[str, Any]:
  """The model checked before anything is scanned or any actor starts (it resolves, its options read, a mix's
  weights one per layer), and what identifies it in the job's settings: the sha256 of its files."""
  resolved = resolve.resolve_model(model, use="model")
  parts.check_weights(fmt.output, loaded.read_options(resolved)["lstm"]["n_layers"] + 1)
  model_files = sorted({p for p in (resolved.options_file, resolved.weight_file, resolved.vocab_file,
                                    *resolved.read_files) if p and os.path.isfile(p)})
  return {"spec": model, "sha256": [files.cached_sha256(p) for p in model_files]}


def _settings(model: dict[str, Any], fmt: parts.Format, output_format: str, batch: int, chunk: int,
              shard_lines: int, tokenize: bool, max_tokens: int | None, on_bad_line: str,
              files_: Sequence[corpus.InputFile]) -> dict[str, Any]:
  """What decides the shards' bytes (a rerun with other settings is refused)."""
  return {"model": model, "format": dataclasses.asdict(fmt), "output_format": output_format, "batch_size": batch,
          "chunk_size": chunk, "shard_lines": shard_lines, "tokenize": tokenize, "max_tokens": max_tokens,
          "on_bad_line": on_bad_line,
          "inputs": [{"path": f.path, "lines": f.lines, "sha256": f.sha256} for f in files_]}


def _init_ray(ray, address: str | None) -> None:
  """Joins the cluster at `address` (or the one this process already joined; None: starts a local one), with
  Ray's own progress bars and INFO lines off: the job prints its own progress."""
  if not ray.is_initialized():
    ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
  ray.util.log_once("ray_data_progress_manager_disabled")  # its warning that bars are off: they are meant to be
  context = ray.data.DataContext.get_current()
  context.enable_progress_bars = False
  context.print_on_execution_start = False
