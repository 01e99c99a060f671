"""An input is read once: a pipe, a FIFO and `-` (stdin) give the file a regular input gives (spooled into the
job folder once: the job reads its input several times), and an input that holds nothing is refused instead
of a run that ends with "wrote ... (0 lines)". And what the model's char ids cut is what is counted: bilm-tf's
ids keep 48 UTF-8 bytes, so 17 Chinese characters are cut."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import stream_util

from elmo_jax.data import chars
from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import writer as embed
from elmo_jax.embedding.embedder import Embedder
from embed_util import SENTENCES, model_args, write_lines
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS

LINES = SENTENCES[0][:3] + SENTENCES[1][:2]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
  return Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)


def _arrays(path) -> dict[str, np.ndarray]:
  with h5py.File(path, "r") as f:
    return {k: f[k][...] for k in f if k != "sentence_to_index"}


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_fifo_input_is_read_once_and_gives_the_regular_files_output(tmp_path, embedder, gzipped):
  text = "".join(line + "\n" for line in LINES).encode()
  regular = tmp_path / "in.txt"
  regular.write_bytes(text)
  embed.embed_file(embedder, regular, tmp_path / "want.hdf5", batch_size=2, progress_every=None)
  fifo = stream_util.fifo(tmp_path, gzip.compress(text) if gzipped else text)
  stats = embed.embed_file(embedder, fifo, tmp_path / "got.hdf5", batch_size=2, progress_every=None)
  assert stats["lines"] == len(LINES)
  want, got = _arrays(tmp_path / "want.hdf5"), _arrays(tmp_path / "got.hdf5")
  assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
  assert sorted(os.listdir(tmp_path)) == ["got.hdf5", "in.fifo", "in.txt", "want.hdf5"]  # the spool went with the job


def test_an_input_that_holds_nothing_is_refused_in_one_line(tmp_path):
  fifo = stream_util.fifo(tmp_path, b"")
  with pytest.raises(embed_files.EmbedInputError, match=r"in\.fifo: read 0 bytes \(a pipe that was already read, "
                     r"or gave nothing\); nothing to embed"):
    embed_files.check_job(fifo, tmp_path / "out.hdf5")
  assert sorted(os.listdir(tmp_path)) == ["in.fifo"]  # no job folder, no spool left
  (tmp_path / "empty.txt").write_bytes(b"")
  with pytest.raises(embed_files.EmbedInputError, match=r"empty\.txt: read 0 bytes \(an empty file\)"):
    embed_files.check_job(tmp_path / "empty.txt", tmp_path / "out.hdf5")


def test_a_regular_input_is_checked_and_counted_in_one_pass(tmp_path):
  path = write_lines(tmp_path / "in.txt", LINES)
  job_input = embed_files.check_job(path, tmp_path / "out.hdf5")
  assert (job_input.path, job_input.lines, job_input.spooled) == (str(path), len(LINES), False)
  assert job_input.bytes == os.path.getsize(path)


@pytest.mark.parametrize("token,cut", [("中" * 16, False), ("中" * 17, True), ("a" * 48, False), ("a" * 49, True),
                                       ("é" * 24, False), ("é" * 25, True)])
def test_bilm_tf_ids_cut_at_48_utf8_bytes_and_the_count_says_so(token, cut):
  assert chars.is_cut(token) is cut
  ids = chars.token_to_ids(token)
  kept = bytes((ids[1:49] - 1).clip(0, 255).astype(np.uint8))  # the bytes the ids hold, then EOW / padding
  assert kept.startswith(token.encode()[:48]) and (len(token.encode()) > 48) is cut


def test_the_embed_warning_counts_what_the_ids_cut(tmp_path, embedder):
  warnings = []
  path = write_lines(tmp_path / "zh.txt", ["中" * 17 + " 中文", "short " + "中" * 16])
  stats = embed.embed_file(embedder, path, tmp_path / "out.hdf5", batch_size=2, progress_every=None,
                           warn=warnings.append)
  assert stats["long_tokens"] == 1
  assert any("1 tokens longer than 48 UTF-8 bytes were cut" in w and "zh.txt:1" in w for w in warnings), warnings


@pytest.mark.slow
@pytest.mark.parametrize("how", ["process substitution", "stdin"])
def test_the_command_reads_a_pipe_and_stdin(tmp_path, how):
  """`--input_file=<(zcat corpus.gz)` and `--input_file=- < corpus` write every line (the trial's fault: 0 lines
  and exit 0)."""
  corpus = tmp_path / "corpus.gz"
  corpus.write_bytes(gzip.compress("".join(line + "\n" for line in LINES).encode()))
  out = tmp_path / "out.hdf5"
  args = " ".join([*model_args(), f"--output_file={out}", "--noprogress"])
  command = (f"{sys.executable} -m elmo_jax embed {args} --input_file=<(zcat {corpus})" if how != "stdin" else
             f"zcat {corpus} | {sys.executable} -m elmo_jax embed {args} --input_file=-")
  proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr
  assert f"({len(LINES)} lines)" in proc.stderr
  assert len(_arrays(out)) == len(LINES)
