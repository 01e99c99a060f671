"""The engines' corpus and shard files without an engine: inputs named and scanned once, shards of whole chunks,
a shard's lines read back (seek or gzip skip: the same lines), bad lines named, shard files written whole and
checked by a rerun, a job folder of other settings refused, a shard worker's bits equal to the embed command's."""
from __future__ import annotations

import gzip
import json
import os

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from elmo_jax.embedding import writer
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.engines import corpus
from elmo_jax.engines import shard_files
from elmo_jax.engines import worker
from paths import FIXTURE_DIR

LINES = ["the cat sat", "", "on the mat .", "a b c d e f g", "x", "more words here", "last line"]


@pytest.fixture
def texts(tmp_path):
  plain = tmp_path / "a.txt"
  plain.write_text("\n".join(LINES) + "\n")
  packed = tmp_path / "b.txt.gz"
  with gzip.open(packed, "wb") as f:
    f.write(("\n".join(LINES[::-1])).encode())  # no newline at the end: its last line still counts
  return str(plain), str(packed)


def test_expand_globs_commas_order_and_missing(texts, tmp_path):
  plain, packed = texts
  assert corpus.expand([f"{tmp_path}/*.txt*"]) == [plain, packed]
  assert corpus.expand([f"{packed},{plain}", plain]) == [packed, plain]  # order as given, each file once
  with pytest.raises(corpus.CorpusError, match=r"\*.nope matches no file"):
    corpus.expand([f"{tmp_path}/*.nope"])
  with pytest.raises(corpus.CorpusError, match="missing.txt: input file not found"):
    corpus.expand([str(tmp_path / "missing.txt")])


def test_scan_shards_and_read_back_plain_and_gzip(texts):
  scans = [corpus.scan(p, 3) for p in texts]
  assert [s["lines"] for s in scans] == [7, 7]
  assert scans[0]["offsets"] == [0, len("the cat sat\n\non the mat .\n"), sum(len(x) + 1 for x in LINES[:6])]
  assert scans[1]["offsets"] is None  # gzip: skipped to, not seeked
  files_ = corpus.input_files(scans)
  assert [f.first_index for f in files_] == [0, 7]
  shards = corpus.shards(files_, 3)
  assert [(s.path, s.first_line, s.lines, s.first_index) for s in shards] == [
      (texts[0], 0, 3, 0), (texts[0], 3, 3, 3), (texts[0], 6, 1, 6),
      (texts[1], 0, 3, 7), (texts[1], 3, 3, 10), (texts[1], 6, 1, 13)]
  read = [[text for _, text, _ in corpus.read_shard(s)] for s in shards]
  assert sum(read[:3], []) == LINES and sum(read[3:], []) == LINES[::-1]


def test_scan_names_lines_that_are_not_utf8(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine\n\xff\xfe broken\nfine again\n")
  scan = corpus.scan(str(bad), 10)
  assert scan["lines"] == 3 and [line for line, _ in scan["bad"]] == [1]
  assert "invalid UTF-8 at byte 0" in scan["bad"][0][1]
  shard = corpus.shards(corpus.input_files([scan]), 10)[0]
  assert [(line, text is None, why is not None) for line, text, why in corpus.read_shard(shard)] == [
      (0, False, False), (1, True, True), (2, False, False)]


def test_a_file_that_shrank_since_its_scan_is_named(texts):
  shard = corpus.shards(corpus.input_files([corpus.scan(texts[0], 100)]), 100)[0]
  with open(texts[0], "w") as f:
    f.write("one line\n")
  with pytest.raises(corpus.CorpusError, match="changed during the job"):
    list(corpus.read_shard(shard))


@pytest.mark.parametrize("shapes", [[(3, 4, 2), (3, 0, 2), (3, 1, 2)], [(2,), (2,)], [(5, 2), (1, 2)]])
def test_nested_array_keeps_every_shape(shapes):
  arrays = [np.arange(np.prod(s), dtype=np.float32).reshape(s) + k for k, s in enumerate(shapes)]
  column = shard_files.nested_array(arrays, "float32").to_pylist()
  for got, want in zip(column, arrays):
    np.testing.assert_array_equal(np.asarray(got, np.float32).reshape(want.shape), want)


@pytest.fixture(scope="module")
def fixture_embedder():
  return Embedder.from_pretrained(FIXTURE_DIR, warm=False)


@pytest.mark.parametrize("output_format", shard_files.FORMATS)
def test_shard_worker_equals_the_embed_command_and_a_rerun_checks_it(fixture_embedder, texts, tmp_path,
                                                                     output_format):
  plain = texts[0]
  fmt = worker.output_format("top")
  scans = corpus.input_files([corpus.scan(plain, 4)])
  out = str(tmp_path / "out")
  shard_files.open_job(out, {"settings": 1})
  run = worker.ShardWorker(fixture_embedder, fmt, out, output_format, "sha", chunk_size=4, batch_size=2)
  records = [run.run(s) for s in corpus.shards(scans, 4)]
  assert [r["written_lines"] for r in records] == [4, 3] and all(r["written"] for r in records)
  reference = str(tmp_path / "ref.hdf5")
  writer.embed_file(fixture_embedder, plain, reference, 2, chunk_size=4, output="top", progress_every=None)
  with h5py.File(reference) as ref:
    if output_format == "parquet":
      rows = pq.read_table([os.path.join(out, r["file"]) for r in records]).to_pylist()
      got = {r["index"]: np.asarray(r["embedding"], np.float32).reshape(-1, 32) for r in rows}
      assert [r["text"] for r in rows] == LINES and [r["line"] for r in rows] == list(range(7))
    else:
      got = {}
      for r in records:
        with h5py.File(os.path.join(out, r["file"])) as f:
          got.update({int(k): f[k][()] for k in f if k != "sentence_to_index"})
          assert set(json.loads(f["sentence_to_index"][0]).values()) <= {str(i) for i in range(7)}
    for i in range(7):  # the same chunks of the same file: the same bits
      np.testing.assert_array_equal(got[i], ref[str(i)][()])
  shards = corpus.shards(scans, 4)
  assert sorted(shard_files.written(out, shards, "sha", output_format)) == [0, 1]
  assert shard_files.written(out, shards, "other settings", output_format) == {}
  with open(os.path.join(out, records[1]["file"]), "ab") as f:  # a damaged shard is written again
    f.write(b"x")
  assert sorted(shard_files.written(out, shards, "sha", output_format)) == [0]


def test_bad_lines_stop_writes_nothing_skip_lists_them(fixture_embedder, tmp_path):
  text = tmp_path / "t.txt"
  text.write_bytes(b"one two\n\xff bad\nthree four five six\nseven\n")
  shard = corpus.shards(corpus.input_files([corpus.scan(str(text), 8)]), 8)[0]
  out = str(tmp_path / "out")
  shard_files.open_job(out, {})
  stop = worker.ShardWorker(fixture_embedder, worker.output_format("average"), out, "parquet", "s", 8,
                            max_tokens=3, on_bad_line="stop")
  record = stop.run(shard)
  assert not record["written"] and [b[2] for b in record["bad_lines"]] == [1, 2]
  assert not os.path.exists(os.path.join(out, "shard-00000.parquet"))
  skip = worker.ShardWorker(fixture_embedder, worker.output_format("average"), out, "parquet", "s", 8,
                            max_tokens=3, on_bad_line="skip")
  record = skip.run(shard)
  assert record["written"] and record["written_lines"] == 2
  assert "over --max_tokens=3" in record["bad_lines"][1][3]
  assert pq.read_table(os.path.join(out, "shard-00000.parquet")).column("index").to_pylist() == [0, 3]


def test_a_job_folder_of_other_settings_or_files_is_refused(tmp_path):
  out = str(tmp_path / "out")
  shard_files.open_job(out, {"format": "a"})
  shard_files.open_job(out, {"format": "a"})  # the same settings: resumed
  with pytest.raises(shard_files.JobFolderError, match="holds a job of other settings"):
    shard_files.open_job(out, {"format": "b"})
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "x.txt").write_text("mine")
  with pytest.raises(shard_files.JobFolderError, match="not empty and holds no job.json"):
    shard_files.open_job(str(tmp_path / "busy"), {})


def test_output_choices_are_checked_once(fixture_embedder):
  with pytest.raises(ValueError, match="output must be one of layers, top, average, mix"):
    worker.output_format("all")
  with pytest.raises(ValueError, match="exactly when output is 'mix'"):
    worker.output_format("mix")
  with pytest.raises(Exception, match="2 mix weights for a model of 3 layers"):
    worker.check_mix(fixture_embedder, worker.output_format("mix", [0.5, 0.5]))
  mixed = worker.embed_lines(fixture_embedder, [["a", "b"]], worker.output_format("mix", [0, 0, 1]), str)
  top = worker.embed_lines(fixture_embedder, [["a", "b"]], worker.output_format("top"), str)
  np.testing.assert_allclose(mixed[0], top[0], atol=1e-6)
