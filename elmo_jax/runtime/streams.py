"""A stream input (`-` for stdin, a pipe `<(zcat x.gz)`, a FIFO, a device) is bounded from its first block.

    with streams.open_text(path) as f:            # any text input, a file or a stream, opened once (gzip too)
    streams.spool(path, into, "--input_file")     # a stream kept in a file, for a job that reads it again

A stream can be read once and has no size, so nothing is known of it before it is read. Its first block
(`FIRST_BLOCK` bytes, or all of it if shorter; a gzip stream's first block decompressed) is checked as a file's
first bytes are (`files.head_problem`): an HDF5 file, NUL bytes (`/dev/zero`), binary data (`/dev/urandom`)
are one line before anything is kept or parsed. A spool then copies the rest with a bound: before each
`CHUNK` it is written, `files.check_room` must find the chunk's room beside `SPOOL_RESERVE` bytes left free for
what the job writes next (its output), and the spool may hold at most `MAX_SPOOL` bytes: a stream without end
(`yes`) stops in one line instead of at a full disk. Opening a FIFO waits for its writer: after `NOTICE_S`
seconds without a first byte a line on stderr says what is awaited.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import threading
import zlib
from typing import BinaryIO, Iterator

from elmo_jax.runtime import files

STDIN = "-"
FIRST_BLOCK = 4096
CHUNK = 64 << 20
SPOOL_RESERVE = 1 << 30  # left free by a spool: the job's output is written to the same disk next
MAX_SPOOL = 256 << 30  # the most a spool keeps, whatever the disk's room (a documented cap)
NOTICE_S = 3.0


class StreamError(ValueError):
  """A stream refused by its first block, or stopped at its bound; the message is one line naming it."""


def is_stream(path: str | os.PathLike) -> bool:
  """`-` (stdin), a pipe, a FIFO or a device (`files.is_stream`): bytes that can be read once."""
  return os.fspath(path) == STDIN or files.is_stream(path)


class _Rejoined(io.RawIOBase):
  """The block already read, then the rest of the stream: what the reader sees is the whole stream."""

  def __init__(self, head: bytes, rest: BinaryIO):
    super().__init__()
    self._head, self._rest = head, rest

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    if self._head:
      n = min(len(buffer), len(self._head))
      buffer[:n], self._head = self._head[:n], self._head[n:]
      return n
    return self._rest.readinto(buffer)

  def close(self) -> None:
    if not self.closed:
      self._rest.close()
    super().close()


def _named(what: str, path: str) -> str:
  """How a message names the stream: `--input_file=-` (a command's flag), or the path alone (`what` empty)."""
  return f"{what}={path}" if what else path


def _open_raw(path: str, what: str) -> BinaryIO:
  """The stream opened for reading (stdin for `-`); a line on stderr while a FIFO waits for its writer."""
  notice = threading.Timer(NOTICE_S, lambda: print(
      f"{_named(what, path)}: waiting for data (a FIFO or pipe that nothing writes to yet; Ctrl-C stops)",
      file=sys.stderr, flush=True))
  notice.daemon = True
  notice.start()
  try:
    return open(sys.stdin.fileno(), "rb", closefd=False) if path == STDIN else open(path, "rb")
  finally:
    notice.cancel()


def first_block(f: BinaryIO) -> bytes:
  """Up to FIRST_BLOCK bytes of `f` (a pipe gives what its writer wrote so far: read until the block is full)."""
  head = b""
  while len(head) < FIRST_BLOCK:
    block = f.read(FIRST_BLOCK - len(head))
    if not block:
      break
    head += block
  return head


def head_problem(head: bytes) -> str | None:
  """`files.head_problem` of a stream's first block, decompressed when it is gzip (as much as it holds)."""
  if head[:2] == b"\x1f\x8b":
    try:
      head = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(head, FIRST_BLOCK)
    except zlib.error as e:
      return f"is not a whole gzip stream ({e})"
  return files.head_problem(head)


@contextlib.contextmanager
def open_stream(path: str | os.PathLike, what: str = "") -> Iterator[BinaryIO]:
  """A stream's bytes, its first block checked (StreamError, one line naming `what`=`path`) before any is
  given (`what`: the flag that named it, else the path alone); the reader gets every byte, the first block
  included."""
  path = os.fspath(path)
  raw = _open_raw(path, what)
  try:
    head = first_block(raw)
    problem = head_problem(head)
    if problem is not None:
      raise StreamError(f"{_named(what, path)} {problem} (checked from its first {len(head):,} bytes)")
    with io.BufferedReader(_Rejoined(head, raw), 1 << 20) as f:
      yield f
  finally:
    raw.close()


@contextlib.contextmanager
def open_text(path: str | os.PathLike, what: str = "") -> Iterator[BinaryIO]:
  """A text input's bytes opened once, decompressed when they are gzip (by the magic number, peeked: a pipe
  is not read twice); a stream's first block checked first (`open_stream`)."""
  with (open_stream(path, what) if is_stream(path) else open(path, "rb")) as f:
    if f.peek(2)[:2] == b"\x1f\x8b":
      with gzip.GzipFile(fileobj=f, mode="rb") as g:
        yield g
    else:
      yield f


def spool(path: str | os.PathLike, into: str, what: str = "") -> int:
  """The stream `path` copied into the file `into` (which exists), its first block checked first, the copy
  bounded by the disk's room (`SPOOL_RESERVE` kept free) and `MAX_SPOOL`; returns the bytes kept. StreamError
  (one line) when refused or stopped; the caller removes `into`."""
  path, written = os.fspath(path), 0
  folder = os.path.dirname(os.path.abspath(into))
  with open_stream(path, what) as src, open(into, "wb") as out:
    while block := src.read(CHUNK):
      if written + len(block) > MAX_SPOOL:
        raise StreamError(f"{_named(what, path)}: more than {files.human_bytes(MAX_SPOOL)} (streams.MAX_SPOOL), the most a "
                          "stream is kept for a job; stopped: write it to a file (or split it) and give that")
      out.flush()  # what was kept counts as used on the disk the room is asked of
      try:
        files.check_room(folder, len(block) + SPOOL_RESERVE, written + len(block), "the spool in")
      except files.UnsafeOutputError as e:
        raise StreamError(f"{_named(what, path)}: stopped after keeping {files.human_bytes(written)} of the stream "
                          f"({str(e).split(': ', 1)[-1]}; {files.human_bytes(SPOOL_RESERVE)} stay free for the "
                          "output)") from None
      out.write(block)
      written += len(block)
  return written
