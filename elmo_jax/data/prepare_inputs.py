"""What a preparation reads, checked before anything is created: the input's identity (`source_spec`), the
input files (present, non-empty, text), the numbers and the vocabulary file."""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from elmo_jax.runtime import files
from elmo_jax.data.manifest import PrepareError
from elmo_jax.data.prepare_settings import describe_source
from elmo_jax.data.sources import TextSource, TfdsSource, expand_paths
from elmo_jax.data.vocab import Vocab


def source_spec(inputs: Sequence[str] = (), tfds_name: str = "", tfds_split: str = "train",
                tfds_data_dir: str = "", tfds_text_key: str = "text") -> dict[str, Any]:
  """What identifies the input: files with size and mtime, or the TFDS dataset and split."""
  if tfds_name:
    return {"kind": "tfds", "name": tfds_name, "split": tfds_split, "data_dir": tfds_data_dir or "",
            "text_key": tfds_text_key}
  if not inputs:
    raise PrepareError("no input: pass --input=FILES_OR_GLOBS (comma-separated) or --tfds_name")
  try:
    paths = expand_paths(list(inputs))
  except (FileNotFoundError, ValueError) as e:
    raise PrepareError(str(e)) from None
  return {"kind": "text", "files": [{"path": os.path.abspath(p), "size": os.path.getsize(p),
                                     "mtime_ns": os.stat(p).st_mtime_ns} for p in paths]}


def open_source(spec: dict[str, Any]):
  try:
    if spec["kind"] == "tfds":
      return TfdsSource(spec["name"], spec["split"], data_dir=spec["data_dir"] or None, text_key=spec["text_key"])
    return TextSource([f["path"] for f in spec["files"]])
  except (ValueError, OSError) as e:
    raise PrepareError(str(e).splitlines()[0]) from None


def check_inputs(spec: dict[str, Any]) -> None:
  """Refuses, before anything is created, text inputs that cannot be a corpus: binary ones (an HDF5 file,
  NUL bytes, not UTF-8: `files.text_problem`) and an input that is empty (0 bytes in all)."""
  if spec["kind"] != "text":
    return
  for f in spec["files"]:
    problem = files.text_problem(f["path"])
    if problem:
      raise PrepareError(f"{f['path']} {problem}")
  if not any(f["size"] for f in spec["files"]):
    raise PrepareError(f"input {describe_source(spec)} is empty (0 bytes)")


def _is_int(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_numbers(*, chunk_sentences: int, num_workers: int, max_token_chars: int, max_characters_per_token: int,
                  vocab_max_size: int | None, vocab_min_count: int) -> int | None:
  """Refuses (one line naming the setting) a number that would build a wrong corpus or none; returns
  vocab_max_size with 0 (the CLI's "no limit") as None. vocab_max_size counts <S>, </S>, <UNK>: below 4 it
  holds no word (a negative one used to slice the ranking from its end, a near-full vocabulary)."""
  for name, value, low in (("chunk_sentences", chunk_sentences, 1), ("num_workers", num_workers, 1),
                           ("max_token_chars", max_token_chars, 1), ("vocab_min_count", vocab_min_count, 1),
                           ("max_characters_per_token", max_characters_per_token, 3)):
    if not _is_int(value) or value < low:
      raise PrepareError(f"{name}={value!r}: must be an integer >= {low}")
  if vocab_max_size is None or (_is_int(vocab_max_size) and vocab_max_size == 0):
    return None
  if not _is_int(vocab_max_size) or vocab_max_size < 4:
    raise PrepareError(f"vocab_max_size={vocab_max_size!r}: must hold <S>, </S>, <UNK> and a word (>= 4), or be 0 "
                       "for no limit")
  return int(vocab_max_size)


def check_vocab_file(path: str, what: str | None = None) -> Vocab:
  """The vocab file loads as a bilm-tf vocabulary (text, specials present, counts beside it matching); else
  PrepareError, one line naming it as `what` (default `--vocab_file=PATH`). The one vocabulary-file check
  (prepare and the trainer's preflight)."""
  what = what or f"--vocab_file={path}"
  if os.path.isdir(path):
    inside = os.path.join(path, "vocab.txt")
    hint = f" (give {inside})" if os.path.isfile(inside) else ""
    raise PrepareError(f"{what} is a directory, not a vocab file{hint}")
  if not os.path.exists(path):
    raise PrepareError(f"{what}: file not found")
  problem = files.text_problem(path)
  if not problem and path.endswith(".gz"):  # text_problem reads .gz decompressed; a vocabulary is read as is
    problem = "is gzip-compressed; decompress it (gunzip)"
  if problem:
    raise PrepareError(f"{what} {problem}")
  try:
    vocab = Vocab.load(path)
  except UnicodeDecodeError as e:
    raise PrepareError(f"{what} is not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r})") from None
  except (OSError, ValueError) as e:
    message = str(e).splitlines()[0]  # Vocab's messages start with the path ("X: ...", "X:3: ...")
    raise PrepareError(what + message[len(path):] if message.startswith(path) else f"{what}: {message}") from None
  for i, token in enumerate(vocab.tokens):
    if "\t" in token:  # never a token of the tokenizer, and vocab_counts.tsv (token<TAB>count) could not hold it
      raise PrepareError(f"{what}: token {token!r} (entry {i + 1}) holds a tab; a vocabulary lists one token per "
                         "line")
  return vocab
