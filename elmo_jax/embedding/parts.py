"""The part writer of an embedding job (`embedding/writer.py`): what each dataset holds (`Format`) and the
background thread that writes batches into the job's part files (`PartWriter`)."""
from __future__ import annotations

import dataclasses
import os
import queue
import threading
from typing import Any, Callable

import h5py
import numpy as np

from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import job as embed_job
from elmo_jax.embedding.args import select_layers
from elmo_jax.embedding.inputs import ACTIVE_TEMPS, EmbedInputError
from elmo_jax.formats import tfhub


@dataclasses.dataclass
class Format:
  """What each dataset holds and how it is named (see `embed_file`'s arguments); `output` is "all", "top",
  "average", one weight per layer (a mix: the weighted sum of the layers) or a TF-Hub module's output."""
  output: str | list[float] = "all"
  sentence_vectors: bool = False
  dtype: str = "float32"
  use_sentence_keys: bool = False
  mix: dict[str, Any] | None = None  # a TF-Hub module's (weights, scaling) for its outputs `elmo`/`default`

  def __post_init__(self):
    if not isinstance(self.output, str):  # a mix's weights, as the job's settings.json holds them
      self.output = [float(w) for w in self.output]
    if self.mix is not None:  # as the job's settings.json holds it
      self.mix = {k: np.asarray(v).tolist() for k, v in self.mix.items()}


def check_weights(output: str | list[float], n_layers: int) -> None:
  """A mix's weights (`Format.output` as a list) against the model's layers, once, before any line."""
  if not isinstance(output, str) and len(output) != n_layers:
    raise EmbedInputError(f"{len(output)} mix weights for a model of {n_layers} layers (the token layer and "
                          f"{n_layers - 1} biLSTM layers)")


def line_output(layers: np.ndarray, fmt: Format, where: str) -> np.ndarray:
  """One line's dataset: its layers `[n_layers + 1, n_tokens, 2P]` -> what `fmt` holds (all / top / average /
  one weight per layer / a TF-Hub module's output; the mean over the tokens with `sentence_vectors`) in
  `fmt.dtype`. The one place the embed command, the Ray and Beam engines and the server's batch jobs cut a line's
  output, so they give the same bits. float16 holds |x| <= 65504: a larger value would be written as inf,
  silently, so the line is refused (EmbedInputError naming `where`, e.g. `file:line`), not clipped."""
  if isinstance(fmt.output, str) and fmt.output in tfhub.OUTPUTS:
    mix = None if fmt.mix is None else {k: np.asarray(v, np.float32) for k, v in fmt.mix.items()}
    data = tfhub.output(layers, fmt.output, mix)
  else:
    data = select_layers(layers, fmt.output)
  if fmt.sentence_vectors and fmt.output != "default":
    n = layers.shape[1]
    data = data.mean(axis=-2) if n else np.zeros(data.shape[:-2] + data.shape[-1:], np.float32)
  if fmt.dtype != "float16":
    return data
  with np.errstate(over="ignore"):  # the message below says it, in one line, not numpy's warning
    half = np.asarray(data).astype(np.float16)
  over = np.count_nonzero(np.isinf(half) & np.isfinite(data))
  if over:
    raise EmbedInputError(f"{where}: {over} of its {data.size} values are out of float16's range "
                          f"(|x| > 65504, the largest {float(np.abs(data).max()):.4g}) and would be written as "
                          "inf; use --output_dtype=float32")
  return half


class PartWriter:
  """Writes batches into the job's part files from a background thread.

  The device computes batch k+1 (and the main thread reads and prepares the next ones) while batch k is cut
  to its lengths, converted and written. The queue holds at most `depth` batches, so memory stays bounded
  when the disk is slower than the device. A part is built in memory (at most `part_sentences` sentences'
  datasets) and, once its last batch is in, written whole to a temp file and committed (`Job.commit`). An
  error in the thread is raised by the next `put` or `close`.
  """

  def __init__(self, job: embed_job.Job, fmt: Format, where: str, warn: Callable[[str], Any], depth: int = 2):
    self.job, self.fmt, self.where, self.warn = job, fmt, where, warn
    self.error: BaseException | None = None
    self.fout: h5py.File | None = None  # the part being built (in memory)
    self._counts = [0, 0, 0]  # its sentences, tokens and bytes of their text
    self._keys: list[str] = []  # its datasets' names, for its record
    self._slash_warned = False
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._thread = threading.Thread(target=self._run, name="embed-hdf5-writer", daemon=True)
    self._thread.start()

  def put(self, layers: np.ndarray, lines: list[tuple[int, str, int]]) -> None:
    """Queues one batch: layers `[rows, n_layers + 1, time, 2P]` (or a list of rows, `Embedder.batches`) and
    (line index, text, n_tokens) per row."""
    self._put(("batch", layers, lines))

  def commit(self, part: tuple[int, int], state=None) -> None:
    """Queues the end of `part` (its batches were `put` before); `state`: the LSTM state after it."""
    self._put(("commit", part, state))

  def _put(self, item) -> None:
    while True:
      self._raise()
      try:
        self._queue.put(item, timeout=0.1)
        return
      except queue.Full:
        if not self._thread.is_alive():
          self._raise()
          raise RuntimeError("the HDF5 writer thread stopped")

  def close(self, abort: bool = False) -> None:
    """Waits for the queued batches to be written; raises the thread's error (not if `abort`: the main
    thread failed, and its error is the one to report). The queued batches are written even then (at most
    `depth`: the parts they finish are kept for the rerun)."""
    self._queue.put(None)
    self._thread.join()
    self._drop_part()
    if not abort:
      self._raise()

  def _raise(self) -> None:
    if self.error is not None:
      raise self.error

  def _run(self) -> None:
    while (item := self._queue.get()) is not None:
      if self.error is not None:
        continue  # drain until close()
      try:
        if item[0] == "batch":
          self._write_batch(*item[1:])
        else:
          self._commit(*item[1:])
      except BaseException as e:  # pylint: disable=broad-except
        self.error = e

  def _write_batch(self, layers: np.ndarray, lines: list[tuple[int, str, int]]) -> None:
    if self.fout is None:  # built in memory: HDF5 never meets a full disk (it cannot recover from that);
      # grown 16 MiB at a time (HDF5's default 64 KiB copies a large part over and over)
      self.fout = h5py.File(f"part-{id(self)}", "w", driver="core", backing_store=False, block_size=1 << 24)
    for row, (i, text, n) in enumerate(lines):
      self._write(i, text, layers[row][:, :n])
      self._counts[0] += 1
      self._counts[1] += n
      self._counts[2] += len(text.encode()) + 1

  def _commit(self, part: tuple[int, int], state) -> None:
    """The part's file written whole from its in-memory image (a full disk is a plain OSError here), then
    committed with its record."""
    self.fout.flush()
    image = self.fout.id.get_file_image()
    self._drop_part()
    tmp = embed_files.new_part_temp(self.job.parts_dir)
    try:
      self.job.commit(part, tmp, image, tuple(self._counts), self._keys, state=state)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
      ACTIVE_TEMPS.discard(tmp)
    self._counts, self._keys = [0, 0, 0], []

  def _drop_part(self) -> None:
    """The part being built is dropped (committed, or a failed run: committed parts stay for the rerun)."""
    if self.fout is not None:
      self.fout.close()
      self.fout = None

  def _write(self, i: int, text: str, layers: np.ndarray) -> None:
    data = line_output(layers, self.fmt, f"{self.where}:{i + 1}")
    if not self.fmt.use_sentence_keys:
      self.fout.create_dataset(str(i), data=data, dtype=self.fmt.dtype)
      self._keys.append(str(i))
      return
    if "/" in text and not self._slash_warned:  # h5py nests such names in groups, as AllenNLP's files do
      self._slash_warned = True
      self.warn(f"{self.where}:{i + 1}: a sentence key holds '/'; read it back with f[sentence], not by "
                "listing the file's keys")
    try:
      self.fout.create_dataset(text, data=data, dtype=self.fmt.dtype)
      self._keys.append(text)
    except (ValueError, KeyError, TypeError) as e:
      raise EmbedInputError(f"{self.where}:{i + 1}: {text!r} cannot name an HDF5 dataset ({e}); "
                            "drop --use_sentence_keys") from None
