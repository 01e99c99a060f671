"""Training and evaluation text is opened once: a FIFO (or a pipe) reads as the file it carries, gzip found by
its magic number; where a command must read its text twice (training hashes it for the resume check), it
is refused in one line saying why."""
from __future__ import annotations

import gzip
import os

import pytest

import stream_util

from elmo_jax.data.sources import TextSource
from elmo_jax.training import preflight

TEXT = b"the cat sat\n\nthe dog ran\n"


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_text_source_reads_a_fifo_once(tmp_path, gzipped):
  source = TextSource(stream_util.fifo(tmp_path, gzip.compress(TEXT) if gzipped else TEXT))
  assert [source[i] for i in range(len(source))] == ["the cat sat", "the dog ran"]
  assert source.skipped == {"invalid_utf8": 0, "empty": 1}


def test_training_text_from_a_fifo_is_refused_in_one_line(tmp_path):
  path = str(tmp_path / "train.fifo")
  os.mkfifo(path)  # nobody writes: a check that opened it would hang
  with pytest.raises(preflight.PreflightError, match=r"config\.data\.train_files: .*train\.fifo is a pipe or FIFO, "
                     r"which can be read once; training reads its text more than once"):
    preflight.check_text_files("config.data.train_files", path)
