"""Embeds a file of sentences into an HDF5 file of ELMo layers (the layout of AllenNLP's `elmo` command).

    python -m elmo_jax.embed --options_file=O.json --weight_file=W.hdf5 \
        --input_file=S.txt --output_file=E.hdf5 [--batch_size=64] [--stateful]
    python -m elmo_jax.embed --workdir=DIR --input_file=S.txt --output_file=E.hdf5
    python -m elmo_jax.embed --model=original --input_file=S.txt.gz --output_file=E.hdf5 --top \
        --output_dtype=float16
    python -m elmo_jax.embed --model=small --input_file=raw.txt --tokenize --sentence_vectors \
        --average --output_file=V.hdf5
    python -m elmo_jax.embed --model=small --dump_token_embeddings --vocab_file=V.txt --output_file=T.hdf5

Input: one whitespace-tokenized sentence per line (UTF-8, gzip if it is gzipped), or raw text with
`--tokenize` (the trainer's Moses tokenizer). Output: dataset `str(i)` for input line i (0-based) of shape
`(n_layers + 1, n_tokens, 2P)` (`--all`, the default), `(n_tokens, 2P)` (`--top`: the top layer;
`--average`: the mean of the layers), with `--sentence_vectors` the mean over the tokens instead
(`(n_layers + 1, 2P)` or `(2P,)`); float32 or `--output_dtype=float16`. `sentence_to_index`: a (1,)
variable-length string dataset holding `json.dumps({stripped line text: "i"})` (later duplicates win, as
in AllenNLP). With `--use_sentence_keys` the datasets are named by the line text instead and there is no
`sentence_to_index` (AllenNLP's layout; a repeated line is then an error); `--forget_sentences` omits it.

Unlike AllenNLP, an empty line is not an error: it gets a `(n_layers + 1, 0, 2P)` entry and a warning.
The file is streamed in chunks, so memory stays bounded; within a chunk the `Embedder`'s length bucketing
and token dedupe apply. The output is written to a temp file next to it and renamed at the end, so a
failed or interrupted run leaves no half-written output; the temp file is removed on failure and SIGTERM,
and one left by a writer killed outright (kill -9) is removed by the next run for the same output.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import queue
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, TextIO

import h5py
import numpy as np
from absl import logging

from elmo_jax import files
from elmo_jax.embedder import DEFAULT_BATCH_SIZE, Embedder, select_layers

_MAX_EMPTY_WARNINGS = 10  # individual warnings; the rest are only counted
ACTIVE_TEMPS: set[str] = set()  # temp outputs being written, for the CLI's signal handler


class EmbedInputError(ValueError):
  """An input file that cannot be embedded; the message names the file and line."""


def open_binary(path: str | os.PathLike):
  """The file's bytes, decompressed when it is gzip (by its magic number, whatever its name)."""
  with open(path, "rb") as f:
    magic = f.read(2)
  return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def count_lines(path: str | os.PathLike) -> int:
  """Number of lines (a last line without newline counts), by a fast binary scan."""
  n, last = 0, b"\n"
  with open_binary(path) as f:
    try:
      while block := f.read(1 << 20):
        n += block.count(b"\n")
        last = block[-1:]
    except (OSError, EOFError) as e:  # a damaged .gz
      raise EmbedInputError(f"{path}:{n + 1}: cannot read the file further ({e})") from None
  return n + (last != b"\n")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
  """Yields (0-based line index, stripped text); stops with `EmbedInputError` at invalid UTF-8.

  Decoded line by line (binary mode) so the error can name the line, which text mode cannot.
  """
  if not os.path.exists(path):
    raise EmbedInputError(f"{path}: input file not found")
  with open_binary(path) as f:
    i = -1
    while True:
      try:
        raw = f.readline()
      except (OSError, EOFError) as e:  # a damaged .gz
        raise EmbedInputError(f"{path}:{i + 2}: cannot read the file further ({e})") from None
      if not raw:
        break
      i += 1
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise EmbedInputError(
            f"{path}:{i + 1}: invalid UTF-8 at byte {e.start} of the line ({e.reason})") from None
      yield i, text.strip()


def _temp_prefix(output_file: str) -> str:
  """Temp outputs are named `.OUT.HOST.PID.xxxx.tmp`, so a later run can tell a dead writer's."""
  return f".{os.path.basename(output_file)}.{socket.gethostname()}.{os.getpid()}."


def remove_stale_temps(output_file: str | os.PathLike) -> list[str]:
  """Removes temp outputs for `output_file` of writers on this host that no longer run; returns them."""
  output_file = os.fspath(output_file)
  out_dir = os.path.dirname(os.path.abspath(output_file))
  head = f".{os.path.basename(output_file)}.{socket.gethostname()}."
  removed = []
  for name in (os.listdir(out_dir) if os.path.isdir(out_dir) else []):
    if not (name.startswith(head) and name.endswith(".tmp")):
      continue
    pid = name[len(head):].split(".", 1)[0]
    if not pid.isdigit() or _alive(int(pid)):
      continue
    try:
      os.remove(os.path.join(out_dir, name))
      removed.append(name)
    except OSError:
      pass
  return removed


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def check_output_path(output_file: str | os.PathLike) -> None:
  """Fails before any work when the output cannot be written there."""
  output_file = os.fspath(output_file)
  if os.path.isdir(output_file):
    raise EmbedInputError(f"{output_file}: is a directory; give a file path for the output hdf5")
  out_dir = os.path.dirname(os.path.abspath(output_file))
  if not os.path.isdir(out_dir):
    raise EmbedInputError(f"{output_file}: output directory {out_dir} does not exist")
  if not os.access(out_dir, os.W_OK):
    raise EmbedInputError(f"{output_file}: output directory {out_dir} is not writable")


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


@dataclasses.dataclass
class _Format:
  """What each dataset holds and how it is named (see `embed_file`'s arguments)."""
  output: str = "all"
  sentence_vectors: bool = False
  dtype: str = "float32"
  use_sentence_keys: bool = False


@dataclasses.dataclass
class _Lines:
  """What reading the input learned: the sentence index, empty lines, over-long tokens."""
  input_file: str
  max_chars: int
  use_sentence_keys: bool
  warn: Callable[[str], Any]
  sentence_to_index: dict[str, str] = dataclasses.field(default_factory=dict)
  empty: list[int] = dataclasses.field(default_factory=list)
  long_tokens: int = 0
  first_long: str | None = None

  def tokens(self, i: int, text: str, tokenize: Callable[[str], list[str]] | None) -> list[str]:
    """Line i's tokens; records its key, and warns about an empty line."""
    if self.use_sentence_keys:
      _check_sentence_key(self.input_file, i, text, self.sentence_to_index)
    self.sentence_to_index[text] = str(i)
    tokens = tokenize(text) if tokenize is not None else text.split()
    n_long = sum(len(t) > self.max_chars for t in tokens)
    if n_long:
      self.long_tokens += n_long
      self.first_long = self.first_long or f"{self.input_file}:{i + 1}"
    if not tokens:
      self.empty.append(i)
      if len(self.empty) <= _MAX_EMPTY_WARNINGS:
        self.warn(f"{self.input_file}:{i + 1}: empty line; its entry '{i}' has 0 tokens")
    return tokens

  def finish(self) -> None:
    """The run's summary warnings."""
    if len(self.empty) > _MAX_EMPTY_WARNINGS:
      self.warn(f"{self.input_file}: {len(self.empty)} empty lines in all (warned about the first "
                f"{_MAX_EMPTY_WARNINGS})")
    if self.long_tokens:  # bilm-tf cuts them silently; say so once per run
      self.warn(f"{self.input_file}: {self.long_tokens} tokens longer than {self.max_chars} characters were "
                f"cut to their first {self.max_chars} (as bilm-tf does); the first at {self.first_long}")


class _Writer:
  """Writes batches into an open HDF5 file from a background thread.

  The device computes batch k+1 (and the main thread reads and prepares the next ones) while batch k is cut
  to its lengths, converted and written. The queue holds at most `depth` batches, so memory stays bounded
  when the disk is slower than the device. An error in the thread is raised by the next `put` or `close`.
  """

  def __init__(self, fout: h5py.File, fmt: _Format, where: str, warn: Callable[[str], Any], depth: int = 2):
    self.fout, self.fmt, self.where, self.warn = fout, fmt, where, warn
    self.error: BaseException | None = None
    self._slash_warned = False
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._thread = threading.Thread(target=self._run, name="embed-hdf5-writer", daemon=True)
    self._thread.start()

  def put(self, layers: np.ndarray, lines: list[tuple[int, str, int]]) -> None:
    """Queues one batch: layers `[rows, n_layers + 1, time, 2P]` and (line index, text, n_tokens) per row."""
    while True:
      self._raise()
      try:
        self._queue.put((layers, lines), timeout=0.1)
        return
      except queue.Full:
        if not self._thread.is_alive():
          self._raise()
          raise RuntimeError("the HDF5 writer thread stopped")

  def close(self, abort: bool = False) -> None:
    """Waits for the queued batches to be written (`abort`: drops them); raises the thread's error."""
    if abort:
      self.error = self.error or _Aborted()
      while not self._queue.empty():
        self._queue.get_nowait()
    self._queue.put(None)
    self._thread.join()
    if not abort:
      self._raise()

  def _raise(self) -> None:
    if self.error is not None and not isinstance(self.error, _Aborted):
      raise self.error

  def _run(self) -> None:
    while (batch := self._queue.get()) is not None:
      if self.error is not None:
        continue  # drain until close()
      layers, lines = batch
      try:
        for row, (i, text, n) in enumerate(lines):
          self._write(i, text, layers[row, :, :n])
      except BaseException as e:  # pylint: disable=broad-except
        self.error = e

  def _write(self, i: int, text: str, layers: np.ndarray) -> None:
    data = select_layers(layers, self.fmt.output)
    if self.fmt.sentence_vectors:
      n = layers.shape[1]
      data = data.mean(axis=-2) if n else np.zeros(data.shape[:-2] + data.shape[-1:], np.float32)
    if not self.fmt.use_sentence_keys:
      self.fout.create_dataset(str(i), data=data, dtype=self.fmt.dtype)
      return
    if "/" in text and not self._slash_warned:  # h5py nests such names in groups, as AllenNLP's files do
      self._slash_warned = True
      self.warn(f"{self.where}:{i + 1}: a sentence key holds '/'; read it back with f[sentence], not by "
                "listing the file's keys")
    try:
      self.fout.create_dataset(text, data=data, dtype=self.fmt.dtype)
    except (ValueError, KeyError, TypeError) as e:
      raise EmbedInputError(f"{self.where}:{i + 1}: {text!r} cannot name an HDF5 dataset ({e}); "
                            "drop --use_sentence_keys") from None


class _Aborted(Exception):
  """Marks a writer closed because the main thread failed (its own error is the one to report)."""


def embed_file(embedder: Embedder, input_file: str | os.PathLike, output_file: str | os.PathLike,
               batch_size: int = DEFAULT_BATCH_SIZE, *, chunk_size: int = 4096,
               progress_every: float | None = 5.0,
               progress_stream: TextIO | None = None,
               warn: Callable[[str], Any] = logging.warning, output: str = "all",
               sentence_vectors: bool = False, output_dtype: str = "float32", use_sentence_keys: bool = False,
               forget_sentences: bool = False, tokenize: Callable[[str], list[str]] | None = None
               ) -> dict[str, Any]:
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
    output: "all" `(n_layers + 1, n_tokens, 2P)`, "top" or "average" `(n_tokens, 2P)` (`allennlp elmo`).
    sentence_vectors: write the mean over each line's tokens instead (`(n_layers + 1, 2P)` or `(2P,)`).
    output_dtype: "float32" or "float16".
    use_sentence_keys: name each dataset by the line's text (AllenNLP); no `sentence_to_index`.
    forget_sentences: do not write `sentence_to_index`.
    tokenize: `str -> tokens` for raw text (default: split on whitespace).

  Returns:
    {"sentences", "tokens", "empty_lines", "long_tokens", "seconds"}.

  Raises:
    EmbedInputError: missing input file or output directory, or invalid UTF-8 (names the line).
  """
  input_file, output_file = os.fspath(input_file), os.fspath(output_file)
  if not os.path.exists(input_file):
    raise EmbedInputError(f"{input_file}: input file not found")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if output not in ("all", "top", "average") or output_dtype not in ("float32", "float16"):
    raise ValueError(f"output must be all/top/average and output_dtype float32/float16, got {output!r}, "
                     f"{output_dtype!r}")
  check_output_path(output_file)
  remove_stale_temps(output_file)
  progress = Progress(count_lines(input_file), progress_every, progress_stream)
  fmt = _Format(output, sentence_vectors, output_dtype, use_sentence_keys)
  # bilm-tf's ids leave room for the begin/end-of-word marks
  lines = _Lines(input_file, embedder.config.max_characters_per_token - 2, use_sentence_keys, warn)
  with files.atomic_path(output_file, prefix=_temp_prefix(output_file)) as tmp:
    ACTIVE_TEMPS.add(tmp)
    try:
      with h5py.File(tmp, "w") as fout:
        _embed_lines(embedder, lines, _Writer(fout, fmt, input_file, warn), progress,
                     batch_size, -(-max(chunk_size, 1) // batch_size) * batch_size, tokenize)
        lines.finish()
        if not (use_sentence_keys or forget_sentences):
          index = fout.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))
          index[0] = json.dumps(lines.sentence_to_index)
    finally:
      ACTIVE_TEMPS.discard(tmp)
  return {"sentences": progress.sentences, "tokens": progress.tokens, "empty_lines": len(lines.empty),
          "long_tokens": lines.long_tokens, "seconds": time.perf_counter() - progress.start}


def _embed_lines(embedder: Embedder, lines: _Lines, writer: _Writer, progress: Progress,
                 batch_size: int, chunk_size: int, tokenize: Callable[[str], list[str]] | None) -> None:
  """Reads the input chunk by chunk, embeds it with `Embedder.iter_batches` and hands batches to `writer`.

  The batches are `embed_sentences`' (a short last batch padded to a power of two of rows), so the CLI
  compiles no shape the library would not, and a chunk's last batch costs no more than its sentences need.
  (Padding it to full rows instead compiled one more shape; in benchmarks/embed_throughput.py the peak
  RSS rose by ~190 MB during that first embed_file call.)
  """
  try:
    for chunk in _chunks(read_lines(lines.input_file), chunk_size):
      sentences = [lines.tokens(i, text, tokenize) for i, text in chunk]
      for rows, layers in embedder.iter_batches(sentences, batch_size):
        writer.put(layers, [(*chunk[pos], len(sentences[pos])) for pos in rows])
        progress.update(len(rows), sum(len(sentences[pos]) for pos in rows))
  except BaseException:
    writer.close(abort=True)
    raise
  writer.close()


def _check_sentence_key(input_file: str, i: int, text: str, seen: dict[str, str]) -> None:
  """A line's text as an HDF5 dataset name: unique, non-empty, no path syntax."""
  where = f"{input_file}:{i + 1}"
  if text in seen:
    raise EmbedInputError(f"{where}: repeats line {int(seen[text]) + 1}; sentence keys must be unique "
                          "(drop --use_sentence_keys to embed repeated lines)")
  if not text:
    raise EmbedInputError(f"{where}: an empty line cannot name an HDF5 dataset; drop --use_sentence_keys")


def dump_token_embeddings(embedder: Embedder, vocab_file: str | os.PathLike, output_file: str | os.PathLike,
                          batch_size: int = 4096) -> int:
  """bilm-tf's `dump_token_embeddings`: the char-CNN output of every word of `vocab_file`; returns the count."""
  from elmo_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  try:
    tokens = Vocab.load(os.fspath(vocab_file), require_specials=False).tokens
  except (FileNotFoundError, ValueError) as e:
    raise EmbedInputError(str(e)) from None
  embedder.dump_token_embeddings(tokens, output_file, batch_size)
  return len(tokens)


if __name__ == "__main__":  # `python -m elmo_jax.embed`: the command lives with the others in elmo_jax/cli
  from elmo_jax.cli import embed as _cli  # pylint: disable=g-import-not-at-top
  _cli.run()
