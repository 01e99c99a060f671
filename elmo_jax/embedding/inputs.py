"""The embedding command's files: the input read line by line (and checked before any work; its lines'
tokens and warnings: `InputLines`), the output path checked, and the temp files of a run tracked, so a signal
or the next run can remove them."""
from __future__ import annotations

import codecs
import contextlib
import dataclasses
import gzip
import hashlib
import os
import socket
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from elmo_jax.embedding import job as embed_job
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime import streams

ACTIVE_TEMPS: set[str] = set()  # temp outputs and parts being written, for the CLI's signal handler
_TEMPS_LOCK = threading.Lock()  # the writer thread creates part temps under it; remove_active_temps stops that
_EXITING = threading.Event()
ACTIVE_JOBS: set[str] = set()  # job folders of running embed_file calls (kept on a signal, for the rerun)
_MAX_EMPTY_WARNINGS = 10  # individual warnings; the rest are only counted


class EmbedInputError(ValueError):
  """An input file that cannot be embedded; the message names the file and line."""


class EmbedOutputError(EmbedInputError, files.UnsafeOutputError):
  """An output path that cannot be written or would destroy an input (`storage.check_output`); one line."""


def is_gzip(path: str | os.PathLike) -> bool:
  """Whether the file is gzip, by its magic number (whatever its name)."""
  with open(path, "rb") as f:
    return f.read(2) == b"\x1f\x8b"


def open_binary(path: str | os.PathLike):
  """The file's bytes, decompressed when it is gzip (`is_gzip`)."""
  return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def count_lines(path: str | os.PathLike, validate: bool = False, digest: Any = None, name: str | None = None) -> int:
  """Number of lines (a last line without newline counts), by a fast binary scan; `validate`: also checks
  that the text is UTF-8 (`EmbedInputError` naming the line, as `read_lines` would, before any work);
  `digest` (a hashlib object) is updated with the text's bytes in the same pass."""
  n, last = 0, b"\n"
  decoder = codecs.getincrementaldecoder("utf-8")()
  with open_binary(path) as f:
    try:
      while block := f.read(1 << 20):
        n += block.count(b"\n")
        last = block[-1:]
        if digest is not None:
          digest.update(block)
        if validate:
          decoder.decode(block)
      if validate:
        decoder.decode(b"", final=True)
    except (OSError, EOFError) as e:  # a damaged .gz
      raise EmbedInputError(f"{name or path}:{n + 1}: cannot read the file further ({e})") from None
    except UnicodeDecodeError:
      for _ in read_lines(path, name):  # raises at the line
        pass
  return n + (last != b"\n")


class CountedDigest:
  """A sha256 (`count_lines`' digest) that also counts the bytes it is given."""

  def __init__(self):
    self._sha, self.bytes = hashlib.sha256(), 0

  def update(self, block: bytes) -> None:
    self._sha.update(block)
    self.bytes += len(block)

  def hexdigest(self) -> str:
    return self._sha.hexdigest()


def decode_line(raw: bytes) -> tuple[str | None, str | None]:
  """A line's bytes -> (its stripped text, None), or (None, why) where they are not UTF-8: the one reading of a
  line, for the embed command (`read_lines`, which stops there) and the engines (which may skip it)."""
  try:
    return raw.decode("utf-8").strip(), None
  except UnicodeDecodeError as e:
    return None, f"invalid UTF-8 at byte {e.start} of the line ({e.reason})"


def read_lines(path: str | os.PathLike, name: str | None = None) -> Iterator[tuple[int, str]]:
  """Yields (0-based line index, stripped text); stops with `EmbedInputError` at invalid UTF-8, naming the line
  of `name` (default `path`: a spooled input is named as the user gave it).

  Decoded line by line (binary mode) so the error can name the line, which text mode cannot.
  """
  if not os.path.exists(path):
    raise EmbedInputError(f"{path}: input file not found")
  path_read, path = path, name or path
  with open_binary(path_read) as f:
    i = -1
    while True:
      try:
        raw = f.readline()
      except (OSError, EOFError) as e:  # a damaged .gz
        raise EmbedInputError(f"{path}:{i + 2}: cannot read the file further ({e})") from None
      if not raw:
        break
      i += 1
      text, why = decode_line(raw)
      if why is not None:
        raise EmbedInputError(f"{path}:{i + 1}: {why}")
      yield i, text


STDIN = "-"  # --input_file=- : the standard input
SPOOL = "input"  # in the job folder: a piped input, kept for the passes and reruns of its job


def is_stream(path: str) -> bool:
  """`-` (stdin), a pipe (`<(zcat x.gz)`), a FIFO or a device: bytes that can be read once."""
  return streams.is_stream(path)


@dataclasses.dataclass
class JobInput:
  """The input of one embedding job, checked once before the model loads (`check_job`): `source` as the user
  named it, `path` the regular file every pass reads (the input itself, or a stream spooled into the job
  folder once: a job reads its input several times and a rerun compares it), and what one pass learned:
  its lines and the sha256 and bytes of its (decompressed) text."""
  source: str
  path: str
  lines: int
  sha256: str
  bytes: int
  spooled: bool = False

  def adopt(self, folder: str) -> None:
    """Once the job folder is this job's (locked, same settings): a spool becomes the folder's `SPOOL`."""
    if self.spooled and os.path.dirname(self.path) == folder and os.path.basename(self.path) != SPOOL:
      final = os.path.join(folder, SPOOL)
      os.replace(self.path, final)
      ACTIVE_TEMPS.discard(self.path)
      self.path = final

  def discard(self) -> None:
    """A spool not adopted (the job was refused) is removed."""
    if self.spooled and os.path.basename(self.path) != SPOOL and os.path.exists(self.path):
      os.remove(self.path)
      ACTIVE_TEMPS.discard(self.path)
      try:  # the job folder, if the spool was all it held
        os.rmdir(os.path.dirname(self.path))
      except OSError:
        pass


def check_job(input_file: str | os.PathLike, output_file: str | os.PathLike, inputs: Any = (),
              warn: Callable[[str], Any] | None = None, flag: str | None = None) -> JobInput:
  """Every check of an embedding job, once, before the model loads: the output path against the run's `inputs`
  (`check_output_path`), the job folder (`Job.check_folder`), dead writers' temps removed (`warn`ed), and the
  input read once: a regular file for its lines and sha256 (after `text_input_problem`), a stream (`is_stream`)
  spooled into the job folder first. An input that holds nothing is refused: a run never ends with 0 lines
  written because its pipe was already read. Raises EmbedInputError (one line)."""
  source, output_file = os.fspath(input_file), os.fspath(output_file)
  stream = is_stream(source)
  if not stream and not os.path.exists(source):
    raise EmbedInputError(f"{source}: input file not found")
  named = f"{flag}={source} " if flag else f"{source}: "  # the command names its flag, a library call the file
  check_output_path(output_file, [p for p in (source, *inputs) if p and p != STDIN and not is_stream(p)],
                    "--output_file" if flag else "output_file")
  embed_job.Job.check_folder(output_file)
  for name in remove_stale_temps(output_file):
    (warn or (lambda m: None))(f"removed {name}, left by an embedding run that was killed")
  path = _spool(source, output_file + embed_job.SUFFIX) if stream else source
  job_input = JobInput(source, path, 0, "", 0, spooled=stream)
  try:
    problem = text_input_problem(path)
    if problem is not None:
      raise EmbedInputError(f"{named}{problem}")
    digest = CountedDigest()  # of the (decompressed) text: the job's identity, read in the same pass
    job_input.lines = count_lines(path, validate=True, digest=digest, name=source)
    job_input.sha256, job_input.bytes = digest.hexdigest(), digest.bytes
    if not digest.bytes:
      why = "a pipe that was already read, or gave nothing" if stream else "an empty file"
      raise EmbedInputError(f"{named.rstrip(': ')}: read 0 bytes ({why}); nothing to embed")
  except BaseException:
    job_input.discard()
    raise
  return job_input


def _spool(source: str, folder: str) -> str:
  """The stream `source` copied, read once, into a temp file of the job folder (`streams.spool`); its path."""
  os.makedirs(folder, exist_ok=True)
  with _TEMPS_LOCK:
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp", prefix=f".input.{socket.gethostname()}.{os.getpid()}.")
    ACTIVE_TEMPS.add(tmp)
  os.close(fd)
  try:  # its first block checked, then kept within the disk's room (`streams`: the one read of a stream)
    streams.spool(source, tmp, "--input_file")
  except (OSError, streams.StreamError) as e:
    os.remove(tmp)
    ACTIVE_TEMPS.discard(tmp)
    with contextlib.suppress(OSError):  # the job folder, if the spool was all it held
      os.rmdir(folder)
    if isinstance(e, streams.StreamError):
      raise EmbedInputError(str(e)) from None
    raise EmbedInputError(f"--input_file={source}: cannot keep the stream in {folder} for the job's passes "
                          f"({e.strerror or e}); write it to a file and give that") from None
  return tmp


def temp_prefix(output_file: str) -> str:
  """Temp outputs are named `.OUT.HOST.PID.xxxx.tmp`, so a later run can tell a dead writer's."""
  return f".{os.path.basename(output_file)}.{socket.gethostname()}.{os.getpid()}."


def remove_active_temps() -> None:
  """The signal handler's cleanup: removes every temp file being written, and no new one is created after
  (the writer thread would otherwise start the next part between this and the exit)."""
  _EXITING.set()
  with _TEMPS_LOCK:
    for tmp in list(ACTIVE_TEMPS):
      try:
        os.remove(tmp)
      except OSError:
        pass


def new_part_temp(directory: str) -> str:
  with _TEMPS_LOCK:
    while _EXITING.is_set():  # the process is exiting: never create a file it would leave behind
      time.sleep(3600)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp", prefix=f".part.{socket.gethostname()}.{os.getpid()}.")
    os.close(fd)
    ACTIVE_TEMPS.add(tmp)
  return tmp


def remove_stale_temps(output_file: str | os.PathLike) -> list[str]:
  """Removes temp files of writers on this host that no longer run: outputs for `output_file`, parts and input
  spools of its job folder (`embed_job`); returns their names."""
  output_file = os.fspath(output_file)
  host, folder = socket.gethostname(), output_file + embed_job.SUFFIX
  return (files.remove_dead_temps(os.path.dirname(os.path.abspath(output_file)),
                                  f".{os.path.basename(output_file)}.{host}.") +
          files.remove_dead_temps(os.path.join(folder, "parts"), f".part.{host}.") +
          files.remove_dead_temps(folder, f".input.{host}."))


def text_input_problem(path: str | os.PathLike) -> str | None:
  """Why `path` cannot be the text (or vocabulary) of an embedding run, from its first bytes
  (`files.text_problem`): 'is a directory, not a text file', 'is an HDF5 file, not text', binary data;
  None for text (invalid UTF-8 in text is reported later, naming its line)."""
  problem = files.text_problem(path)
  return None if problem is None or problem.startswith("is not UTF-8") else problem


def check_output_path(output_file: str | os.PathLike, inputs: Any = (), what: str = "output_file") -> None:
  """`storage.check_output` of the output hdf5 against the run's `inputs` (input, options, weight, vocab and
  token files), before any work; raises `EmbedOutputError` (an `EmbedInputError` and an
  `UnsafeOutputError`)."""
  try:
    storage.check_output(output_file, what, inputs=inputs)
  except files.UnsafeOutputError as e:
    raise EmbedOutputError(str(e)) from None


def chunks(lines: Iterator[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
  chunk: list[tuple[int, str]] = []
  for item in lines:
    chunk.append(item)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


def check_sentence_keys(input_file: str, name: str | None = None) -> None:
  """Every line's text as an HDF5 dataset name: unique, non-empty, and not the group of another line's name
  (h5py nests a name holding '/' in groups: `x` and `x/y z` cannot both be datasets); before any device work."""
  seen: dict[tuple[str, ...], tuple[int, str]] = {}  # a name's path as HDF5 reads it ('//' is '/') -> line, text
  input_file, path_read = name or input_file, input_file
  for i, text in read_lines(path_read, input_file):
    where, path = f"{input_file}:{i + 1}", tuple(c for c in text.split("/") if c)
    if not text:
      raise EmbedInputError(f"{where}: an empty line cannot name an HDF5 dataset; drop --use_sentence_keys")
    if path in seen:
      raise EmbedInputError(f"{where}: repeats line {seen[path][0] + 1}; sentence keys must be unique (drop "
                            "--use_sentence_keys to embed repeated lines)")
    if not path or text.endswith("/") or "." in path:
      raise EmbedInputError(f"{where}: {text!r} cannot name an HDF5 dataset (an empty or '.' part between "
                            "'/'s); drop --use_sentence_keys")
    seen[path] = (i, text)
  for path, (i, text) in seen.items():
    group = next((path[:k] for k in range(1, len(path)) if path[:k] in seen), None)
    if group is not None:
      (first, a), (second, b) = sorted([(i, text), seen[group]])
      raise EmbedInputError(f"{input_file}:{second + 1}: {b!r} cannot name an HDF5 dataset beside line {first + 1}'s "
                            f"{a!r} ('/' makes one a group of the other); drop --use_sentence_keys")


@dataclasses.dataclass
class InputLines:
  """What reading the input learned: empty lines, tokens the model's char ids cut (warned about as
  `embed_file` meets them). `input_file` names the input in messages, `path` is the file read; `cut`:
  (token -> whether the ids cut it, the cut in words, e.g. '48 UTF-8 bytes')."""
  input_file: str
  path: str
  cut: tuple[Callable[[str], bool], str]
  warn: Callable[[str], Any]
  empty: list[int] = dataclasses.field(default_factory=list)
  long_tokens: int = 0
  first_long: str | None = None

  def tokens(self, i: int, text: str, tokenize: Callable[[str], list[str]] | None) -> list[str]:
    """Line i's tokens; warns about an empty line."""
    tokens = tokenize(text) if tokenize is not None else text.split()
    n_long = sum(map(self.cut[0], tokens))
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
      self.warn(f"{self.input_file}: {self.long_tokens} tokens longer than {self.cut[1]} were cut to their "
                f"first {self.cut[1]} by the model's char ids; the first at {self.first_long}")
