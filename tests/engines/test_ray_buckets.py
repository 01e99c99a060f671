"""`elmo-jax embed --engine=ray` with its inputs and its output folder in a bucket (tests/gcs_util.py's real GCS
server, a local Ray cluster of its own whose actors are pointed at it): a glob of `gs://` objects (one gzip),
every line once, shards equal to a local run's of the same files, the job's files in the bucket, a rerun that
skips every shard, and a glob that matches nothing as one line."""
from __future__ import annotations

import gzip
import io
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from elmo_jax.engines import corpus
from elmo_jax.engines import shard_files
from elmo_jax.runtime import storage
import gcs_util
from paths import FIXTURE_DIR, REPO_ROOT

ray = pytest.importorskip("ray")
from elmo_jax.engines import ray_data  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow
gcs_server, bucket = gcs_util.gcs_server, gcs_util.bucket  # the fixtures
CHUNK = 64  # lines a chunk and a shard: 3 + 2 shards


@pytest.fixture(scope="module")
def cluster(gcs_server, tmp_path_factory):
  """A local cluster for this file whose workers talk to the emulator, with a download cache of their own
  (the driver's is the test's: a copy per machine, here two on one)."""
  env = {**gcs_server.env, "ELMO_JAX_CACHE": str(tmp_path_factory.mktemp("actor-cache"))}
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
  yield
  ray.shutdown()


@pytest.fixture(scope="module")
def corpus_folder(tmp_path_factory):
  """The shipped corpus's first 150 lines as a plain file and the next 100 as gzip, in a local folder."""
  folder = tmp_path_factory.mktemp("corpus")
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "valid.txt.gz"), "rt", encoding="utf-8") as f:
    lines = [next(f) for _ in range(250)]
  (folder / "a.txt").write_text("".join(lines[:150]))
  with gzip.open(folder / "b.txt.gz", "wt", encoding="utf-8") as f:
    f.write("".join(lines[150:]))
  (folder / "notes.md").write_text("not matched by the glob\n")
  return folder


def _embed(inputs, out_dir):
  return ray_data.embed_corpus(FIXTURE_DIR, inputs, out_dir, cluster=ray_data.Cluster(actors=2), output="top",
                               chunk_size=CHUNK, progress_every=None)


def _table(data: bytes) -> dict[str, list]:
  return pq.read_table(io.BytesIO(data)).to_pydict()


def test_inputs_and_shards_in_a_bucket_equal_a_local_run_and_a_rerun_skips_them(cluster, bucket, corpus_folder,
                                                                               tmp_path):
  for name in ("a.txt", "b.txt.gz", "notes.md"):
    storage.upload(str(corpus_folder / name), f"{bucket}/corpus/{name}")
  local = _embed([str(corpus_folder / "*.txt*")], str(tmp_path / "local"))
  out = f"{bucket}/out/"
  remote = _embed([f"{bucket}/corpus/*.txt*"], out)

  assert remote["lines"] == remote["written_lines"] == 250 and not remote["bad_lines"]
  covered = [i for s in remote["shards"] for i in range(s["first_index"], s["first_index"] + s["lines"])]
  assert covered == list(range(250))  # every line once, in corpus order
  assert [s["input"] for s in remote["shards"]] == [f"{bucket}/corpus/a.txt"] * 3 + [f"{bucket}/corpus/b.txt.gz"] * 2
  assert json.loads(storage.read_bytes(f"{bucket}/out/manifest.json"))["shards"] == remote["shards"]
  names = set(storage.listdir(out))
  assert names == {"job.json", "manifest.json", *(f"shard-{i:05d}.{x}" for i in range(5) for x in ("json", "parquet"))}

  for want, got in zip(local["shards"], remote["shards"]):
    data = storage.read_bytes(f"{bucket}/out/{got['file']}")
    assert len(data) == got["bytes"]
    mine = _table(data)
    theirs = _table(open(tmp_path / "local" / want["file"], "rb").read())
    assert set(mine["file"]) == {got["input"]} and set(theirs["file"]) == {want["input"]}
    for column in ("index", "line", "text"):
      assert mine[column] == theirs[column]
    for a, b in zip(mine["embedding"], theirs["embedding"]):  # bit for bit: the same chunks
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert json.loads(storage.read_bytes(f"{bucket}/out/shard-{got['shard']:05d}.json"))["sha256"] == got["sha256"]

  damaged = bytearray(storage.read_bytes(f"{bucket}/out/shard-00001.parquet"))
  damaged[len(damaged) // 2] ^= 1  # the same size: only its crc32c tells
  storage.write_bytes(f"{bucket}/out/shard-00001.parquet", bytes(damaged))
  rerun = _embed([f"{bucket}/corpus/*.txt*"], out)
  assert rerun["skipped_shards"] == 4 and rerun["embedded_shards"] == 1  # the damaged one written again
  assert rerun["shards"] == remote["shards"]


def test_a_glob_that_matches_nothing_or_a_missing_bucket_is_one_line(cluster, bucket, tmp_path):
  storage.write_bytes(f"{bucket}/corpus/a.txt", b"one line\n")
  for pattern in (f"{bucket}/corpus/*.gz", f"{bucket}/nothing/*.txt", f"{bucket}/*.txt",  # `*` within a part
                  "gs://no-such-bucket/corpus/*.txt"):
    with pytest.raises(corpus.CorpusError) as raised:
      _embed([pattern], str(tmp_path / "out"))
    assert str(raised.value) == f"--input_file={pattern} matches no file"
  with pytest.raises(corpus.CorpusError, match=r"corpus is a folder, not a file; give a glob of its files"):
    _embed([f"{bucket}/corpus"], str(tmp_path / "out"))
  with pytest.raises(corpus.CorpusError, match="a wildcard in a bucket's name"):
    _embed(["gs://b-*/corpus/a.txt"], str(tmp_path / "out"))
  with pytest.raises(shard_files.JobFolderError) as raised:  # before any shard is embedded
    _embed([f"{bucket}/corpus/a.txt"], "gs://no-such-bucket/out")
  assert str(raised.value) == ("--output_dir=gs://no-such-bucket/out: the bucket gs://no-such-bucket does not "
                               "exist (or is not visible to these credentials)")
