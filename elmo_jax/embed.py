"""Embeds a file of sentences into an HDF5 file of ELMo layers (the layout of AllenNLP's `elmo` command).

    python -m elmo_jax.embed --options_file=O.json --weight_file=W.hdf5 \
        --input_file=S.txt --output_file=E.hdf5 [--batch_size=64] [--stateful]
    python -m elmo_jax.embed --workdir=DIR --input_file=S.txt --output_file=E.hdf5

Input: one whitespace-tokenized sentence per line (UTF-8). Output: dataset `str(i)` for input line i
(0-based) of shape `(n_layers + 1, n_tokens, 2P)` float32, and `sentence_to_index`: a (1,) variable-length
string dataset holding `json.dumps({stripped line text: "i"})` (later duplicates win, as in AllenNLP).

Unlike AllenNLP, an empty line is not an error: it gets a `(n_layers + 1, 0, 2P)` entry and a warning.
The file is streamed in chunks, so memory stays bounded; within a chunk the `Embedder`'s length bucketing
and token dedupe apply. The output is written to a temp file next to it and renamed at the end, so a
failed or interrupted run leaves neither a half-written output nor the temp file.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from typing import Any, Callable, Iterator, TextIO

import h5py
import numpy as np
from absl import app
from absl import flags
from absl import logging

from elmo_jax import options as options_lib
from elmo_jax import weights as weights_lib
from elmo_jax.embedder import DEFAULT_BATCH_SIZE, Embedder

_MAX_EMPTY_WARNINGS = 10  # individual warnings; the rest are only counted
_ACTIVE_TEMPS: set[str] = set()  # temp outputs being written, for the CLI's signal handler


class EmbedInputError(ValueError):
  """An input file that cannot be embedded; the message names the file and line."""


def count_lines(path: str | os.PathLike) -> int:
  """Number of lines (a last line without newline counts), by a fast binary scan."""
  n, last = 0, b"\n"
  with open(path, "rb") as f:
    while block := f.read(1 << 20):
      n += block.count(b"\n")
      last = block[-1:]
  return n + (last != b"\n")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
  """Yields (0-based line index, stripped text); stops with `EmbedInputError` at invalid UTF-8.

  Decoded line by line (binary mode) so the error can name the line, which text mode cannot.
  """
  if not os.path.exists(path):
    raise EmbedInputError(f"{path}: input file not found")
  with open(path, "rb") as f:
    for i, raw in enumerate(f):
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise EmbedInputError(
            f"{path}:{i + 1}: invalid UTF-8 at byte {e.start} of the line ({e.reason})") from None
      yield i, text.strip()


def _chunks(lines: Iterator[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
  chunk: list[tuple[int, str]] = []
  for item in lines:
    chunk.append(item)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


class Progress:
  """Prints `embedded n/N sentences (x sent/s, y tok/s, ETA h:mm:ss)` at most every `every` seconds."""

  def __init__(self, total: int, every: float | None = 5.0, stream: TextIO | None = None):
    self.total, self.every = total, every
    self.stream = stream if stream is not None else sys.stderr
    self.start = self._last = time.perf_counter()
    self.sentences = self.tokens = 0

  def update(self, sentences: int, tokens: int) -> None:
    self.sentences += sentences
    self.tokens += tokens
    now = time.perf_counter()
    if self.every is not None and now - self._last >= self.every:
      self._last = now
      self.stream.write(self.line(now) + "\n")
      self.stream.flush()

  def line(self, now: float | None = None) -> str:
    elapsed = max((now or time.perf_counter()) - self.start, 1e-9)
    rate = self.sentences / elapsed
    eta = (self.total - self.sentences) / rate if rate > 0 else float("inf")
    eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
    return (f"embedded {self.sentences}/{self.total} sentences ({rate:.1f} sent/s, "
            f"{self.tokens / elapsed:.0f} tok/s, ETA {eta_text})")


def _embed_chunk(embedder: Embedder, sentences: list[list[str]], batch_size: int
                 ) -> Iterator[tuple[list[int], np.ndarray]]:
  """Yields (chunk positions, layers `[rows, n_layers + 1, time, 2P]`) batch by batch.

  Same batching as `Embedder.embed_sentences` (stable length sort when stateless, input order when
  stateful), rows padded to `batch_size`, so results match it exactly; yielding per batch lets the
  caller write and report progress as each batch finishes (while the next one computes).
  """
  return embedder.iter_batches(sentences, batch_size, full_rows=True)


def embed_file(embedder: Embedder, input_file: str | os.PathLike, output_file: str | os.PathLike,
               batch_size: int = DEFAULT_BATCH_SIZE, *, chunk_size: int = 4096,
               progress_every: float | None = 5.0,
               progress_stream: TextIO | None = None,
               warn: Callable[[str], Any] = logging.warning) -> dict[str, Any]:
  """Embeds every line of `input_file` into `output_file` (HDF5, AllenNLP `elmo` layout).

  Args:
    embedder: the model; its `stateful` flag decides the batching (see `Embedder`).
    input_file: UTF-8 text, one whitespace-tokenized sentence per line.
    output_file: HDF5 to write; replaced only once everything succeeded.
    batch_size: sentences per batch.
    chunk_size: lines read (and held) at once; rounded up to a multiple of `batch_size` so stateful
      batches are the same consecutive groups of lines however the file is chunked.
    progress_every: seconds between progress lines (None: none).
    progress_stream: where progress goes (default stderr).
    warn: called with a message for empty lines.

  Returns:
    {"sentences", "tokens", "empty_lines", "seconds"}.

  Raises:
    EmbedInputError: missing input file or output directory, or invalid UTF-8 (names the line).
  """
  input_file, output_file = os.fspath(input_file), os.fspath(output_file)
  if not os.path.exists(input_file):
    raise EmbedInputError(f"{input_file}: input file not found")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  chunk_size = -(-max(chunk_size, 1) // batch_size) * batch_size
  progress = Progress(count_lines(input_file), progress_every, progress_stream)
  out_dir = os.path.dirname(os.path.abspath(output_file))
  if not os.path.isdir(out_dir):
    raise EmbedInputError(f"{output_file}: output directory {out_dir} does not exist")
  # Same directory, so the final rename is atomic (never a copy across file systems).
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(output_file)}.", suffix=".tmp", dir=out_dir)
  os.close(fd)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; the output should get the usual permissions
  _ACTIVE_TEMPS.add(tmp)
  sentence_to_index: dict[str, str] = {}
  empty: list[int] = []
  try:
    with h5py.File(tmp, "w") as fout:
      for chunk in _chunks(read_lines(input_file), chunk_size):
        sentences = []
        for i, text in chunk:
          sentence_to_index[text] = str(i)
          sentences.append(text.split())
          if not sentences[-1]:
            empty.append(i)
            if len(empty) <= _MAX_EMPTY_WARNINGS:
              warn(f"{input_file}:{i + 1}: empty line; its entry '{i}' has 0 tokens")
        for rows, layers in _embed_chunk(embedder, sentences, batch_size):
          for row, pos in enumerate(rows):
            n = len(sentences[pos])
            fout.create_dataset(str(chunk[pos][0]), data=layers[row, :, :n], dtype="float32")
          progress.update(len(rows), sum(len(sentences[pos]) for pos in rows))
      if len(empty) > _MAX_EMPTY_WARNINGS:
        warn(f"{input_file}: {len(empty)} empty lines in all (warned about the first "
             f"{_MAX_EMPTY_WARNINGS})")
      index = fout.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))
      index[0] = json.dumps(sentence_to_index)
    os.replace(tmp, output_file)
  finally:
    _ACTIVE_TEMPS.discard(tmp)
    if os.path.exists(tmp):
      os.remove(tmp)
  return {"sentences": progress.sentences, "tokens": progress.tokens, "empty_lines": len(empty),
          "seconds": time.perf_counter() - progress.start}


# --- command line -------------------------------------------------------------------------------------
FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the command's flags; only when run as a command, so importing `embed_file` adds none."""
  flags.DEFINE_string("options_file", None, "options.json of the biLM.")
  flags.DEFINE_string("weight_file", None, "ELMo weights (hdf5, bilm-tf/AllenNLP layout).")
  flags.DEFINE_string("workdir", None, "A training run's directory (uses export/options.json and "
                      "export/weights.hdf5); instead of --options_file/--weight_file.")
  flags.DEFINE_string("input_file", None, "One whitespace-tokenized sentence per line (UTF-8).")
  flags.DEFINE_string("output_file", None, "Output hdf5.")
  flags.DEFINE_integer("batch_size", DEFAULT_BATCH_SIZE, "Sentences per batch.")
  flags.DEFINE_bool("stateful", False, "Carry each batch row's LSTM state into the next batch "
                    "(bilm-tf semantics; sentences are then batched in file order).")
  flags.DEFINE_integer("chunk_size", 4096, "Lines read and embedded at once (bounds memory).")
  flags.DEFINE_float("progress_every", 5.0, "Seconds between progress lines on stderr.")
  flags.DEFINE_bool("compilation_cache", True, "Keep compiled shapes in JAX's persistent compilation cache "
                    "under $ELMO_JAX_CACHE (default ~/.cache/elmo_jax), so the next run starts fast.")


def _on_signal(signum, frame):  # pylint: disable=unused-argument
  # Raising from a signal handler is unreliable (it can land in a weakref callback and be swallowed), so
  # the handler itself removes the unfinished outputs and exits at once.
  for tmp in list(_ACTIVE_TEMPS):
    try:
      os.remove(tmp)
    except OSError:
      pass
  os.write(2, f"error: interrupted by signal {signum}; no output written\n".encode())
  os._exit(128 + signum)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  for name in ("input_file", "output_file"):
    if not FLAGS[name].value:
      raise app.UsageError(f"--{name} is required")
  if FLAGS.workdir and (FLAGS.options_file or FLAGS.weight_file):
    raise app.UsageError("give either --workdir or --options_file/--weight_file, not both")
  if not FLAGS.workdir and not (FLAGS.options_file and FLAGS.weight_file):
    raise app.UsageError("give --options_file and --weight_file (or --workdir)")
  if FLAGS.batch_size < 1:
    raise app.UsageError(f"--batch_size must be >= 1, got {FLAGS.batch_size}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # keeps JAX's backend INFO lines out of the one-line errors
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, _on_signal)
  try:
    if not os.path.exists(FLAGS.input_file):  # fail before spending time on loading the model
      raise EmbedInputError(f"{FLAGS.input_file}: input file not found")
    if FLAGS.workdir:
      embedder = Embedder.from_workdir(FLAGS.workdir, stateful=FLAGS.stateful,
                                       compilation_cache=FLAGS.compilation_cache)
    else:
      embedder = Embedder.from_files(FLAGS.options_file, FLAGS.weight_file, stateful=FLAGS.stateful,
                                     compilation_cache=FLAGS.compilation_cache)
    stats = embed_file(embedder, FLAGS.input_file, FLAGS.output_file, FLAGS.batch_size,
                       chunk_size=FLAGS.chunk_size, progress_every=FLAGS.progress_every)
  except (EmbedInputError, weights_lib.WeightFileError, options_lib.OptionsError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  rate = stats["sentences"] / max(stats["seconds"], 1e-9)
  print(f"wrote {FLAGS.output_file}: {stats['sentences']} sentences, {stats['tokens']} tokens in "
        f"{stats['seconds']:.1f} s ({rate:.1f} sent/s)", file=sys.stderr)
  return 0


def run() -> None:
  define_flags()
  app.run(main)


if __name__ == "__main__":
  run()
