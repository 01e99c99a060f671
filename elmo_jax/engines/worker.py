"""What an engine's worker does, with no engine in it: lines embedded through a warm `Embedder` into the output
chosen before anything is written (`embed_lines`, for a Ray batch or a Beam batch), and a whole shard of a
corpus embedded and written with its record (`ShardWorker`, for `elmo-jax embed --engine=ray`).

A shard's lines go through `Embedder.batches` in the embed command's chunks (`chunk_size` lines of the file,
`fresh_every` the command's part of batches), and each line's array is cut by `parts.line_output`, the
command's own: a line gives the same bits as in `elmo-jax embed --input_file=its file` (bad lines left out
of a chunk change its batches, and so its bits within rounding).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from typing import Any, Callable, Sequence

import numpy as np

from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding import parts
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.engines import corpus
from elmo_jax.engines import shard_files
from elmo_jax.engines.corpus import Shard

OUTPUTS = ("layers", "top", "average", "mix")
ON_BAD_LINE = ("stop", "skip")


def output_format(output: str = "average", mix: Sequence[float] | None = None, sentence_vectors: bool = False,
                  dtype: str = "float32") -> parts.Format:
  """The output chosen before anything is written: `layers` (all of them, `[n_layers + 1, n_tokens, 2P]`),
  `top` or `average` (`[n_tokens, 2P]`), `mix` (the layers weighted by `mix`, one weight per layer: e.g. a
  trained ScalarMix's `gamma * softmax(s)`); `sentence_vectors`: the mean over the tokens instead; float32 or
  float16. ValueError (one line) for anything else."""
  if output not in OUTPUTS:
    raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
  if (output == "mix") != (mix is not None):
    raise ValueError("give mix weights (one per layer) exactly when output is 'mix'")
  if dtype not in ("float32", "float16"):
    raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
  chosen: str | list[float] = "all" if output == "layers" else output
  if output == "mix":
    weights = np.asarray(mix, np.float64)
    if weights.ndim != 1 or not weights.size or not np.all(np.isfinite(weights)):
      raise ValueError(f"mix must be one finite weight per layer, got {mix!r}"[:200])
    chosen = weights.tolist()
  return parts.Format(chosen, sentence_vectors, dtype)


def check_mix(embedder: Embedder, fmt: parts.Format) -> None:
  """A mix's weights against the model's layers, once, before any line (`parts.check_weights`)."""
  parts.check_weights(fmt.output, embedder.n_layers)


def embed_lines(embedder: Embedder, sentences: Sequence[Sequence[str]], fmt: parts.Format,
                where: Callable[[int], str], batch_size: int | None = None) -> list[np.ndarray]:
  """Each sentence's output (`parts.line_output`), in order: the sentences batched by `Embedder.batches` as the
  embed command batches one of its chunks; `where(i)` names sentence i in an error (e.g. `file:line`)."""
  out: list[Any] = [None] * len(sentences)
  for _, rows, layers, _ in embedder.batches(sentences, batch_size or embedder.default_batch_size,
                                             fresh_every=embed_job.DEFAULT_PART_BATCHES):
    for r, i in enumerate(rows):
      out[i] = parts.line_output(layers[r][:, :len(sentences[i])], fmt, where(i))
  return out


@dataclasses.dataclass
class ShardWorker:
  """Embeds whole shards of a job into `output_dir` (see `shard_files`): what one Ray actor holds."""
  embedder: Embedder
  fmt: parts.Format
  output_dir: str
  output_format: str
  settings_sha: str
  chunk_size: int
  batch_size: int | None = None
  tokenize: Callable[[str], list[str]] | None = None
  max_tokens: int | None = None
  on_bad_line: str = "stop"

  def run(self, shard: Shard) -> dict[str, Any]:
    """Embeds and writes `shard`, then its record, and returns the record. With bad lines (not UTF-8, over
    `max_tokens`): `skip` leaves them out and lists them in the record; `stop` writes nothing and returns a
    record that lists them (the driver stops the job with the first)."""
    start = time.perf_counter()
    lines, bad = [], []
    for line, text, why in corpus.read_shard(shard):
      tokens = None if text is None else (self.tokenize(text) if self.tokenize is not None else text.split())
      if why is None and self.max_tokens is not None and len(tokens) > self.max_tokens:
        why = f"{len(tokens)} tokens, over --max_tokens={self.max_tokens}"
      if why is not None:
        bad.append([shard.first_index + line - shard.first_line, shard.path, line, why])
      else:
        lines.append((line, text, tokens))
    record = {"shard": shard.number, "input": shard.path, "first_line": shard.first_line,
              "first_index": shard.first_index, "lines": shard.lines, "bad_lines": bad,
              "settings": self.settings_sha, "worker": f"{socket.gethostname()}:{os.getpid()}"}
    if bad and self.on_bad_line == "stop":
      return {**record, "written": False, "written_lines": 0, "tokens": 0, "sha256": None, "bytes": 0,
              "file": None, "seconds": time.perf_counter() - start}
    writer = shard_files.ShardWriter(self.output_dir, shard, self.output_format, self.fmt.dtype)
    try:
      for chunk in _chunks(lines, shard.first_line, self.chunk_size):
        sentences = [tokens for _, _, tokens in chunk]
        outputs = embed_lines(self.embedder, sentences, self.fmt, lambda i, c=chunk: f"{shard.path}:{c[i][0] + 1}",
                              self.batch_size)
        for (line, text, _), embedding in zip(chunk, outputs):
          writer.put(shard.first_index + line - shard.first_line, line, text, embedding)
      digest, size = writer.close()
    except BaseException:
      writer.abort()
      raise
    record = {**record, "written": True, "file": writer.name, "written_lines": len(lines),
              "tokens": sum(len(t) for _, _, t in lines), "sha256": digest, "bytes": size,
              **({"crc32c": writer.crc32c} if writer.crc32c else {}),
              "seconds": time.perf_counter() - start}
    shard_files.write_record(self.output_dir, record)
    return record


def _chunks(lines: list[tuple[int, str, list[str]]], first_line: int, chunk_size: int):
  """The good lines grouped by the embed command's chunk of their file (lines first_line + k * chunk_size ..)."""
  group: list[tuple[int, str, list[str]]] = []
  for item in lines:
    if group and (item[0] - first_line) // chunk_size != (group[0][0] - first_line) // chunk_size:
      yield group
      group = []
    group.append(item)
  if group:
    yield group
