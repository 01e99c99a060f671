"""`elmo-jax embed --engine=ray` and `EmbedBatches` on a local Ray cluster (one for the file, 2 CPUs): every line
once, equal to the embed command's output (bit for bit: the same chunks), Parquet and HDF5 shards, an actor
killed mid-job (Ray retries its task), the driver killed (the rerun finishes from the written shards), bad lines
stopped or skipped and named."""
from __future__ import annotations

import glob
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest

from elmo_jax.embedding import writer
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.engines import corpus
from cluster_page import page_python_blocks
from paths import FIXTURE_DIR, REPO_ROOT

ray = pytest.importorskip("ray")
from elmo_jax.engines import ray_data  # pylint: disable=g-import-not-at-top,wrong-import-position

pytestmark = pytest.mark.slow
CHUNK = 64  # lines a chunk and a shard: several shards from the shipped corpus's 300 lines


@pytest.fixture(scope="module")
def cluster():
  """One local cluster for the file (Ray's old single-process local mode is gone)."""
  info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
  yield info.address_info["gcs_address"]
  ray.shutdown()


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
  """The shipped corpus's first 300 lines as a plain file and the next 100 as gzip."""
  folder = tmp_path_factory.mktemp("corpus")
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "valid.txt.gz"), "rt", encoding="utf-8") as f:
    lines = [next(f) for _ in range(400)]
  (folder / "a.txt").write_text("".join(lines[:300]))
  with gzip.open(folder / "b.txt.gz", "wt", encoding="utf-8") as f:
    f.write("".join(lines[300:]))
  return str(folder / "a.txt"), str(folder / "b.txt.gz")


@pytest.fixture(scope="module")
def reference(corpus_files, tmp_path_factory):
  """The embed command's output (`writer.embed_file`, in-process) of each file: {(file, line): top layer}."""
  embedder = Embedder.from_pretrained(FIXTURE_DIR, warm=False)
  out = {}
  for path in corpus_files:
    target = str(tmp_path_factory.mktemp("ref") / "ref.hdf5")
    writer.embed_file(embedder, path, target, chunk_size=CHUNK, output="top", progress_every=None)
    with h5py.File(target) as f:
      out.update({(path, int(k)): f[k][()] for k in f if k != "sentence_to_index"})
  return out


def _rows(out_dir: str) -> dict[tuple[str, int], np.ndarray]:
  table = pq.read_table(sorted(glob.glob(os.path.join(out_dir, "shard-*.parquet")))).to_pylist()
  return {(r["file"], r["line"]): np.asarray(r["embedding"], np.float32).reshape(-1, 32) for r in table}


def _assert_equal(got: dict, reference: dict) -> None:
  assert sorted(got) == sorted(reference)  # every line exactly once
  for key, want in reference.items():
    np.testing.assert_array_equal(got[key], want, err_msg=str(key))


def _embed(out_dir, inputs, **kwargs):
  return ray_data.embed_corpus(FIXTURE_DIR, inputs, out_dir, cluster=ray_data.Cluster(actors=2), output="top",
                               chunk_size=CHUNK, progress_every=None, **kwargs)


def test_parquet_shards_equal_the_embed_command_and_the_manifest_is_complete(cluster, corpus_files, reference,
                                                                            tmp_path):
  manifest = _embed(str(tmp_path / "out"), [os.path.join(os.path.dirname(corpus_files[0]), "*.txt*")])
  _assert_equal(_rows(str(tmp_path / "out")), reference)
  assert manifest["lines"] == manifest["written_lines"] == 400 and not manifest["bad_lines"]
  covered = [i for s in manifest["shards"] for i in range(s["first_index"], s["first_index"] + s["lines"])]
  assert covered == list(range(400))  # every index in one shard, in order
  on_disk = json.load(open(tmp_path / "out" / "manifest.json"))
  assert on_disk["shards"] == manifest["shards"] and len(on_disk["shards"]) == 7  # 5 + 2 shards of 64 lines


def test_hdf5_shards_in_allennlp_layout(cluster, corpus_files, reference, tmp_path):
  out = tmp_path / "out"
  manifest = _embed(str(out), [corpus_files[0]], output_format="hdf5")
  got = {}
  for shard in manifest["shards"]:
    with h5py.File(out / shard["file"]) as f:
      index = json.loads(f["sentence_to_index"][0])
      got.update({(corpus_files[0], int(k)): f[k][()] for k in f if k != "sentence_to_index"})
      assert set(index.values()) == {str(i) for i in range(shard["first_index"],
                                                          shard["first_index"] + shard["lines"])}
  _assert_equal(got, {k: v for k, v in reference.items() if k[0] == corpus_files[0]})


def _actor_pids() -> list[int]:
  pids = []
  for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
      with open(path, "rb") as f:
        cmdline = f.read().decode(errors="replace")
    except OSError:
      continue
    if "EmbedShards" in cmdline:
      pids.append(int(path.split("/")[2]))
  return pids


def test_an_actor_killed_mid_job_is_retried_and_the_output_is_complete(cluster, corpus_files, reference, tmp_path):
  out = str(tmp_path / "out")
  killed = []

  def kill_one_actor():
    deadline = time.time() + 120
    while not glob.glob(os.path.join(out, "shard-*.json")) and time.time() < deadline:
      time.sleep(0.02)
    pids = _actor_pids()
    if pids:
      os.kill(pids[0], signal.SIGKILL)
      killed.append(pids[0])

  thread = threading.Thread(target=kill_one_actor, daemon=True)
  thread.start()
  manifest = _embed(out, [corpus_files[0]])
  thread.join()
  assert killed, "no actor was found to kill"
  assert manifest["written_lines"] == 300
  assert not os.path.exists(f"/proc/{killed[0]}/cmdline") or "EmbedShards" not in open(
      f"/proc/{killed[0]}/cmdline", errors="replace").read()  # it died, and its shard was embedded by another
  _assert_equal(_rows(out), {k: v for k, v in reference.items() if k[0] == corpus_files[0]})


def _command(out_dir: str, address: str, *extra: str) -> list[str]:
  """The embed command on the fixture model, joining this file's cluster by its address."""
  return [sys.executable, "-m", "elmo_jax", "embed", "--engine=ray", f"--ray_address={address}",
          f"--model={FIXTURE_DIR}", f"--output_dir={out_dir}", "--top", f"--chunk_size={CHUNK}", "--actors=1",
          "--progress_every=0", *extra]


def test_the_driver_killed_then_the_rerun_finishes_from_the_written_shards(cluster, corpus_files, reference,
                                                                          tmp_path):
  out = str(tmp_path / "out")
  command = _command(out, cluster, f"--input_file={corpus_files[0]}")
  driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 120
  while not glob.glob(os.path.join(out, "shard-*.json")) and time.time() < deadline and driver.poll() is None:
    time.sleep(0.02)
  driver.kill()
  driver.wait()
  before = {p: os.stat(p).st_mtime_ns for p in glob.glob(os.path.join(out, "shard-*.parquet"))}
  assert before and len(before) < 5, "the driver should be killed with some shards written, not all"
  rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr
  assert f"resuming; {len(before)} of 5 shards are already written and checked" in rerun.stderr
  assert f"{len(before)} shards were written earlier" in rerun.stderr
  assert {p: os.stat(p).st_mtime_ns for p in before} == before  # not written again
  _assert_equal(_rows(out), {k: v for k, v in reference.items() if k[0] == corpus_files[0]})


def test_bad_lines_stop_the_job_or_are_skipped_and_listed(cluster, tmp_path):
  text = tmp_path / "t.txt"
  text.write_bytes(b"one two\n\xff bad\nthree four five six\nseven\n")
  stop = subprocess.run(_command(str(tmp_path / "stop"), cluster, f"--input_file={text}"), capture_output=True,
                        text=True, timeout=300)
  assert stop.returncode == 1
  assert stop.stderr.strip().splitlines()[-1].startswith(f"error: {text}:2: invalid UTF-8 at byte 0")
  assert not glob.glob(str(tmp_path / "stop" / "shard-*"))  # refused before anything was embedded
  skip = subprocess.run(_command(str(tmp_path / "skip"), cluster, f"--input_file={text}", "--on_bad_line=skip",
                                 "--max_tokens=3"), capture_output=True, text=True, timeout=300)
  assert skip.returncode == 0, skip.stderr
  assert f"{text}:2: skipped line 1: invalid UTF-8" in skip.stderr
  assert f"{text}:3: skipped line 2: 4 tokens, over --max_tokens=3" in skip.stderr
  manifest = json.load(open(tmp_path / "skip" / "manifest.json"))
  assert [b[0] for b in manifest["bad_lines"]] == [1, 2] and manifest["written_lines"] == 2


def test_embed_batches_in_a_users_pipeline(cluster, corpus_files):
  lines = open(corpus_files[0], encoding="utf-8").read().splitlines()[:100]
  ds = ray.data.from_items([{"text": line} for line in lines])
  rows = ds.map_batches(ray_data.EmbedBatches, batch_size=32, compute=ray.data.ActorPoolStrategy(size=1),
                        fn_constructor_kwargs={"model": FIXTURE_DIR, "output": "average",
                                               "sentence_vectors": True}).take_all()
  embedder = Embedder.from_pretrained(FIXTURE_DIR, warm=False)
  want = embedder.sentence_vectors([line.split() for line in lines], "average")
  got = {r["text"]: r["embedding"] for r in rows}
  assert len(rows) == 100
  for line, vector in zip(lines, want):  # other batches than the reference's: within rounding
    np.testing.assert_allclose(got[line], vector, atol=1e-5)


def test_a_model_that_cannot_load_is_one_line(cluster, corpus_files, tmp_path):
  command = [a for a in _command(str(tmp_path / "out"), cluster, f"--input_file={corpus_files[1]}")
             if not a.startswith("--model=")] + ["--model=/nonexistent/model"]
  result = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in result.stderr


def test_a_scan_task_names_a_missing_glob(cluster, tmp_path):
  with pytest.raises(corpus.CorpusError, match="matches no file"):
    _embed(str(tmp_path / "out"), [str(tmp_path / "*.none")])


def test_the_pages_command_and_python_blocks_run(cluster, corpus_files, tmp_path, monkeypatch):
  (tmp_path / "corpus").mkdir()
  for name, path in zip(("a", "b"), corpus_files):
    with open(path, "rb") as f:
      data = f.read()
    with gzip.open(tmp_path / "corpus" / f"{name}.txt.gz", "wb") as f:
      f.write(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
  monkeypatch.chdir(tmp_path)
  command = ["elmo-jax", "embed", "--engine=ray", "--model=small", "--input_file=corpus/*.txt.gz",
             "--output_dir=embedded/", "--average"]  # the page's, on the fixture model and this file's cluster
  command = [sys.executable, "-m", "elmo_jax", *command[1:]]
  command[command.index("--model=small")] = f"--model={FIXTURE_DIR}"
  done = subprocess.run(command + [f"--ray_address={cluster}"], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith("wrote embedded/: 2 shards, 400 lines")
  blocks = page_python_blocks("pyarrow") + page_python_blocks("import ray")
  assert len(blocks) == 2
  exec(compile("\n".join(blocks), "docs/cluster.md", "exec"), {})  # pylint: disable=exec-used
  vectors = pq.read_table(sorted(glob.glob("vectors/*.parquet")))
  assert vectors.num_rows == 400 and vectors.column("embedding")[0].to_numpy().shape == (32,)
