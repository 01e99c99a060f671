"""A stream input is bounded from its first block (runtime/streams.py), from every reader of one: the embed
job's spool, the evaluation readers, TextSource. `/dev/zero` wrote 4.2 GB into the job folder in 5 s, and a
stream without end stopped only at a full disk."""
from __future__ import annotations

import collections
import gzip
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

import stream_util
from elmo_jax.data.sources import TextSource
from elmo_jax.embedding import inputs as embed_files
from elmo_jax.evaluation import readers
from elmo_jax.runtime import files
from elmo_jax.runtime import streams
from paths import REPO_ROOT

ZERO = "/dev/zero"
Usage = collections.namedtuple("usage", "total used free")


def test_dev_zero_is_refused_from_its_first_block_by_every_reader(tmp_path):
  want = "/dev/zero holds NUL bytes: binary data, not text (checked from its first 4,096 bytes)"
  with pytest.raises(embed_files.EmbedInputError) as e:
    embed_files.check_job(ZERO, tmp_path / "out.hdf5")
  assert str(e.value) == f"--input_file={want}"
  assert os.listdir(tmp_path) == []  # no spool, no job folder
  with pytest.raises(readers.InputError) as e:
    list(readers._lines(ZERO))  # pylint: disable=protected-access
  assert str(e.value) == want
  with pytest.raises(streams.StreamError, match="holds NUL bytes"):
    TextSource(ZERO)


@settings(max_examples=25, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=12_000), gzipped=st.booleans())
def test_a_text_stream_gives_every_byte_and_binary_ones_are_one_line(tmp_path_factory, text, gzipped):
  """Text of any length (around the first block's 4,096 bytes), plain or gzip, comes through whole; the same
  with an HDF5 signature or a NUL in its first block is refused in one line."""
  folder = tmp_path_factory.mktemp("s")
  data = text.encode()
  with streams.open_text(stream_util.fifo(folder, gzip.compress(data) if gzipped else data)) as f:
    assert f.read() == data
  bad = b"\x89HDF\r\n\x1a\n" + data if text else b"a\x00b"
  with pytest.raises(streams.StreamError) as e:
    with streams.open_text(stream_util.fifo(folder, gzip.compress(bad) if gzipped else bad, "bad.fifo")):
      pass
  assert "\n" not in str(e.value) and ("HDF5" in str(e.value) or "NUL" in str(e.value)), str(e.value)


def test_a_spool_stops_at_the_disks_room_and_at_its_cap(tmp_path, monkeypatch):
  monkeypatch.setattr(streams, "CHUNK", 1 << 10)
  room = {"free": streams.SPOOL_RESERVE + (5 << 10)}  # room for 5 chunks beside the reserve, less what is written

  def usage(path):
    written = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(tmp_path) for n in names
                  if not n.endswith(".fifo"))
    return Usage(1 << 40, written, room["free"] - written)
  monkeypatch.setattr(files.shutil, "disk_usage", usage)
  with pytest.raises(embed_files.EmbedInputError) as e:  # as `yes | elmo-jax embed --input_file=-` would
    embed_files.check_job(stream_util.fifo(tmp_path, b"y\n" * (64 << 10)), tmp_path / "out.hdf5")
  message = str(e.value)
  assert message.startswith(f"--input_file={tmp_path}/in.fifo: stopped after keeping 5.1 kB of the stream "
                            "(needs about 1.1 GB free in "), message
  assert "output)" in message and "\n" not in message
  assert sorted(os.listdir(tmp_path)) == ["in.fifo"]  # the spool and the job folder removed
  room["free"] = 1 << 40
  monkeypatch.setattr(streams, "MAX_SPOOL", 3 << 10)
  with pytest.raises(embed_files.EmbedInputError, match=r"more than 3\.1 kB \(streams\.MAX_SPOOL\)"):
    embed_files.check_job(stream_util.fifo(tmp_path, b"y\n" * (64 << 10), "b.fifo"), tmp_path / "out.hdf5")
  job = embed_files.check_job(stream_util.fifo(tmp_path, b"y\n" * 1000, "c.fifo"), tmp_path / "out.hdf5")
  assert (job.lines, job.bytes, job.spooled) == (1000, 2000, True)  # within both bounds: kept whole
  job.discard()


def test_a_fifo_without_a_writer_says_what_it_waits_for(tmp_path):
  fifo = tmp_path / "quiet.fifo"
  os.mkfifo(fifo)
  code = (f"import sys\nsys.path.insert(0, {REPO_ROOT!r})\nfrom elmo_jax.runtime import streams\n"
          f"streams.NOTICE_S = 0.2\nwith streams.open_stream({str(fifo)!r}, '--input_file') as f:\n"
          "  print(f.read().decode())\n")
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(1.5)
  with open(fifo, "w") as f:
    f.write("late text\n")
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0 and out == "late text\n\n", (out, err)
  assert err == (f"--input_file={fifo}: waiting for data (a FIFO or pipe that nothing writes to yet; Ctrl-C "
                 "stops)\n"), err


def test_the_embed_command_refuses_dev_zero_in_one_line_at_once(tmp_path):
  from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS  # pylint: disable=g-import-not-at-top
  started = time.time()
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--options_file={FIXTURE_OPTIONS}",
                         f"--weight_file={FIXTURE_WEIGHTS}", f"--input_file={ZERO}",
                         f"--output_file={tmp_path / 'out.hdf5'}"], capture_output=True, text=True, timeout=300,
                        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].endswith(
      "--input_file=/dev/zero holds NUL bytes: binary data, not text (checked from its first 4,096 bytes)"), proc.stderr
  assert os.listdir(tmp_path) == [] and time.time() - started < 120
