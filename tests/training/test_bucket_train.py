"""A run whose workdir is a bucket (`--workdir=gs://...`), on a real GCS server (tests/gcs_util.py).

Trained, killed with SIGKILL and resumed in the bucket, it must match an uninterrupted local run bit for bit
(losses, metrics.jsonl, exported weights); two trainers on one bucket workdir are refused; a prepared corpus
in the bucket gives the local copy's batches and refuses a tampered object; embed and evaluate write whole
objects; a tampered checkpoint object is found by its crc32c and set aside.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import h5py
import jax
import numpy as np
import pytest

import launch_util
from elmo_jax.runtime import storage
import gcs_util

pytestmark = pytest.mark.slow
gcs_server, bucket = gcs_util.gcs_server, gcs_util.bucket  # the fixtures

STEPS, EVERY, LOG_EVERY = 12, 4, 3


@pytest.fixture(scope="module")
def runs(gcs_server, tmp_path_factory):
  """A: a local run, uninterrupted. B: the same run in a bucket, killed by SIGKILL after step 9 (checkpoint 8
  saved), then run again to the end."""
  root = str(tmp_path_factory.mktemp("bucket_runs"))
  with pytest.MonkeyPatch.context() as mp:
    for key, value in {**gcs_server.env, "ELMO_JAX_CACHE": os.path.join(root, "cache")}.items():
      mp.setenv(key, value)
    url = gcs_server.new_bucket()
    train = launch_util.write_corpus(os.path.join(root, "train.txt"))
    config = launch_util.write_config(os.path.join(root, "tiny.py"), train, num_train_steps=STEPS,
                                      checkpoint_every_steps=EVERY, log_every_steps=LOG_EVERY, keep_checkpoints=2)
    a, b = os.path.join(root, "a"), url + "/run"
    log_a, log_b = os.path.join(root, "a.log"), os.path.join(root, "b.log")
    # B first, alone: it compiles the steps; A and B's rerun then load them from the compilation cache
    # (launched together, A and B would each compile the same programs).
    run_b = launch_util.launch(b, config, log=log_b, signal_at="9:KILL")
    assert launch_util.wait([run_b], 300) == [-signal.SIGKILL], launch_util.read(log_b)[-3000:]
    killed = storage.read_bytes(b + "/metrics.jsonl").decode()
    run_a = launch_util.launch(a, config, log=log_a)
    run_b = launch_util.launch(b, config, log=log_b)
    codes = launch_util.wait([run_a, run_b], 300)
    assert codes == [0, 0], launch_util.read(log_a)[-3000:] + launch_util.read(log_b)[-3000:]
    yield {"a": a, "b": b, "url": url, "log_b": launch_util.read(log_b), "killed_metrics": killed,
           "config": config, "train": train, "root": root, "env": dict(os.environ)}


def test_bucket_run_resumes_after_kill9_bit_identical_to_a_local_run(runs):
  assert "resumed from step 8" in runs["log_b"]
  # The killed run had uploaded up to its last log step (9: the test hook waits for the upload); the resumed
  # run rewound it to the restored step 8.
  assert [r["step"] for r in launch_util.parse_records(runs["killed_metrics"])] == [3, 6, 9]
  bucket_metrics = storage.read_bytes(runs["b"] + "/metrics.jsonl").decode()
  assert launch_util.parse_records(bucket_metrics) == launch_util.records(runs["a"])  # bit-identical losses, every step once
  assert [r["step"] for r in launch_util.parse_records(bucket_metrics)] == [3, 6, 9, 12]
  a = launch_util.exported(runs["a"])
  b = launch_util.exported(storage.local(runs["b"], names=("export",)))  # a local copy of its export/
  assert sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_bucket_workdir_holds_the_run_and_no_debris(runs):
  names = storage.listdir(runs["b"])
  assert {"checkpoints", "config.json", "vocab.txt", "metrics.jsonl", "tensorboard", "export", "prepared"} <= set(names)
  assert "train.lock" not in names  # released at the end
  assert storage.listdir(runs["b"] + "/checkpoints") == ["12", "8", "checksums"]  # keep_checkpoints=2
  assert storage.listdir(runs["b"] + "/export") == ["options.json", "vocab.txt", "weights.hdf5"]
  every = storage.list_objects(runs["b"])  # pylint: disable=protected-access
  assert not [n for n in every if n.endswith((".tmp", ".part", ".partial", storage.RECORD))]
  assert any(n.startswith("tensorboard/events.out.tfevents") for n in every)
  digests = json.loads(storage.read_bytes(runs["b"] + "/checkpoints/checksums/12.json"))
  assert set(digests) == {"step", "crc32c"} and digests["crc32c"]


def test_second_trainer_on_a_bucket_workdir_is_refused_naming_the_holder(runs):
  from elmo_jax.training.lock import WorkdirLock
  held = WorkdirLock.acquire(runs["b"], process_index=0)
  try:
    out = subprocess.run([sys.executable, "train.py", f"--workdir={runs['b']}", f"--config={runs['config']}",
                          "--config.num_train_steps=16"], cwd=launch_util.REPO_ROOT, capture_output=True, text=True,
                         env=launch_util.env(), timeout=300)
  finally:
    held.release()
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"train: error: {runs['b']} is in use by another trainer (pid {os.getpid()} on "
                         f"{socket.gethostname()}"), last
  assert "Traceback" not in out.stderr
  assert not storage.exists(runs["b"] + "/train.lock")
  assert storage.listdir(runs["b"] + "/checkpoints") == ["12", "8", "checksums"]  # nothing trained


def _lock_record(host: str, pid: int) -> bytes:
  return json.dumps({"pid": pid, "host": host, "started": "2026-01-01 00:00:00"}).encode()


def test_bucket_lock_lease_heartbeat_and_takeover(bucket, monkeypatch):
  from elmo_jax.training.lock import WorkdirLock, WorkdirLocked
  run = bucket + "/run"
  monkeypatch.setenv("ELMO_JAX_LOCK_LEASE_S", "1.5")
  # A holder on another machine: refused while its lease runs, taken over once it ran out.
  storage.write_bytes(run + "/train.lock", _lock_record("another-host", 4242))
  with pytest.raises(WorkdirLocked, match=r"pid 4242 on another-host.*taken over 2s after its last heartbeat"):
    WorkdirLock.acquire(run, process_index=0)
  time.sleep(1.8)
  lock = WorkdirLock.acquire(run, process_index=0)
  assert json.loads(storage.read_bytes(run + "/train.lock"))["pid"] == os.getpid()
  # A live holder's heartbeat keeps its lock past the lease.
  time.sleep(2.0)
  with pytest.raises(WorkdirLocked, match=f"pid {os.getpid()}"):
    WorkdirLock.acquire(run, process_index=0)
  lock.release()
  assert not storage.exists(run + "/train.lock")
  # A holder of this machine that no longer runs (a rerun after kill -9): taken over at once.
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  storage.write_bytes(run + "/train.lock", _lock_record(socket.gethostname(), dead.pid))
  WorkdirLock.acquire(run, process_index=0).release()


def test_prepared_corpus_in_a_bucket_gives_the_local_batches_and_refuses_tampering(bucket, tmp_path):
  from elmo_jax.data import manifest, prepare
  from elmo_jax.data.prepared import PreparedCorpus, make_prepared_iterator
  train = launch_util.write_corpus(str(tmp_path / "train.txt"))
  local = str(tmp_path / "prepared")
  prepare.prepare(local, [train], vocab_max_size=500, log_line=lambda _: None)
  made = subprocess.run([sys.executable, "-m", "elmo_jax", "prepare", f"--input={train}", "--vocab_max_size=500",
                         f"--output_dir={bucket}/corpus", "--num_workers=1", "--noprogress"], cwd=launch_util.REPO_ROOT,
                        capture_output=True, text=True, env=launch_util.env(), timeout=120)
  assert made.returncode == 0 and f"uploaded to {bucket}/corpus" in made.stdout, made.stderr[-2000:]
  assert storage.listdir(bucket + "/corpus") == sorted(os.listdir(local))  # no .partial, no local record

  def batches(directory: str) -> list:
    corpus = PreparedCorpus(directory)
    it = make_prepared_iterator(corpus, corpus.vocab(), batch_size=4, unroll_steps=5, seed=3)
    return [next(it) for _ in range(6)]

  for x, y in zip(batches(local), batches(bucket + "/corpus")):
    assert sorted(x) == sorted(y)
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
  copy = storage.copy_path(bucket + "/corpus")
  stamp = os.stat(os.path.join(copy, "tokens.npy")).st_mtime_ns
  PreparedCorpus(bucket + "/corpus")  # a rerun (a resume): nothing downloaded again
  assert os.stat(os.path.join(copy, "tokens.npy")).st_mtime_ns == stamp
  tokens = bytearray(storage.read_bytes(bucket + "/corpus/tokens.npy"))
  tokens[-1] ^= 0xFF  # same size, other bytes
  storage.write_bytes(bucket + "/corpus/tokens.npy", bytes(tokens))
  with pytest.raises(manifest.PreparedCorpusError, match="tokens.npy"):
    PreparedCorpus(bucket + "/corpus")
  from elmo_jax.training import preflight
  with pytest.raises(preflight.PreflightError, match=r"config.data.prepared_dir: .*tokens.npy"):
    preflight.check_prepared_dir("config.data.prepared_dir", bucket + "/corpus")


def test_embed_and_evaluate_write_whole_objects_to_a_bucket(runs):
  env = launch_util.env()
  out = runs["url"] + "/embeddings/train.hdf5"
  text = runs["url"] + "/text/train.txt"
  storage.upload(runs["train"], text)
  embed = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--workdir={runs['b']}",
                          f"--input_file={text}", f"--output_file={out}", "--noprogress"],
                         cwd=launch_util.REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
  assert embed.returncode == 0, embed.stderr[-2000:]
  assert f"wrote {out}" in embed.stderr
  with h5py.File(storage.local(out), "r") as f:
    assert len([k for k in f if k.isdigit()]) == 300  # one dataset per line of the corpus
  assert storage.listdir(runs["url"] + "/embeddings") == ["train.hdf5"]  # no job folder, no temp object
  binary = os.path.join(runs["root"], "binary.txt")
  with open(binary, "wb") as f:
    f.write(b"\x00\x01" * 100)
  failed = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--workdir={runs['b']}",
                           f"--input_file={binary}", f"--output_file={runs['url']}/embeddings/bad.hdf5"],
                          cwd=launch_util.REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
  assert failed.returncode == 1 and failed.stderr.strip().splitlines()[-1].startswith("error: --input_file=")
  assert storage.listdir(runs["url"] + "/embeddings") == ["train.hdf5"]  # a failed run uploads nothing
  scores = {}
  for name, workdir, text in (("local", runs["a"], runs["train"]), ("bucket", runs["b"], text)):
    ev = subprocess.run([sys.executable, "evaluate.py", "--task=perplexity", f"--workdir={workdir}",
                         f"--text_file={text}", "--max_batches=3", "--noprogress"],
                        cwd=launch_util.REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert ev.returncode == 0, ev.stderr[-2000:]
    read = storage.read_bytes if name == "bucket" else lambda p: open(p, "rb").read()
    scores[name] = json.loads(read(storage.join(workdir, "eval", "perplexity.json")))
  assert scores["bucket"]["ppl"] == scores["local"]["ppl"]


def test_init_from_a_bucket_run_reads_its_checkpoint_there(runs):
  from elmo_jax.data import Vocab
  from elmo_jax.training import init_from
  options = json.loads(storage.read_bytes(runs["b"] + "/config.json"))["options"]
  init_from.check(runs["b"], options)
  vocab = Vocab.load(storage.local(runs["b"] + "/vocab.txt")).sha256()
  bilm, softmax, description = init_from.load(runs["b"], options, vocab)
  assert description == f"checkpoint step 12 of {runs['b']}/checkpoints (with its softmax)"
  local_bilm, local_softmax, _ = init_from.load(runs["a"], options, vocab)
  for x, y in zip(*(jax.tree_util.tree_leaves(t) for t in ((bilm, softmax), (local_bilm, local_softmax)))):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(init_from.InitFromError, match="no such object or folder in the bucket"):
    init_from.check(runs["url"] + "/nothing", options)


def test_tampered_checkpoint_object_fails_its_crc32c_and_is_set_aside(runs):
  from elmo_jax.training.checkpoint import Checkpointer
  ckpt = Checkpointer(runs["b"] + "/checkpoints", keep=2)
  try:
    assert ckpt.verify(12) is None and ckpt.verify(8) is None
    meta = runs["b"] + "/checkpoints/12/meta/metadata"
    storage.write_bytes(meta, storage.read_bytes(meta).replace(b'"', b"'", 1))
    assert ckpt.verify(12) == "file meta/metadata fails its crc32c checksum"
    ckpt._set_aside(12, ckpt.verify(12))  # pylint: disable=protected-access
  finally:
    ckpt.manager.close()
  assert storage.listdir(runs["b"] + "/checkpoints") == ["8", "bad", "checksums"]
  assert storage.listdir(runs["b"] + "/checkpoints/bad") == ["12-file-meta-metadata-fails-its-crc32c-checksum"]


def test_two_processes_with_their_own_disks_train_in_one_bucket_workdir(runs, tmp_path):
  """A pod: each process has its own cache (no shared disk); process 0 writes, process 1 copies the
  auto-prepared corpus down after process 0 uploaded it."""
  url = runs["url"] + "/pod"
  port = launch_util.free_port()
  procs = []
  for i in range(2):
    env_cache = str(tmp_path / f"host{i}")
    os.environ["ELMO_JAX_CACHE"] = env_cache  # launch_util.env copies os.environ
    procs.append(launch_util.launch(url, runs["config"], "--config.data.shard=rows", "--config.num_train_steps=8",
                                    f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                                    f"--process_id={i}", log=str(tmp_path / f"p{i}.log"), devices=2))
  os.environ["ELMO_JAX_CACHE"] = runs["env"]["ELMO_JAX_CACHE"]
  try:
    codes = launch_util.wait(procs, 300)
  except subprocess.TimeoutExpired:  # wait killed both; their logs say where one stopped
    codes = "timed out"
  logs = [launch_util.read(str(tmp_path / f"p{i}.log")) for i in range(2)]
  assert codes == [0, 0], "\n".join(text[-2000:] for text in logs)
  assert all("done: step 8" in text for text in logs)
  assert [r["step"] for r in launch_util.parse_records(storage.read_bytes(url + "/metrics.jsonl").decode())] == [3, 6, 8]
  host1 = storage.copy_path(url, "workdirs").replace(runs["env"]["ELMO_JAX_CACHE"], str(tmp_path / "host1"))
  assert os.listdir(host1) == ["prepared"] or sorted(os.listdir(host1)) == [storage.RECORD, "prepared"]


def test_a_missing_bucket_is_one_line_before_anything_runs(bucket, tmp_path):
  train = launch_util.write_corpus(str(tmp_path / "train.txt"))
  config = launch_util.write_config(str(tmp_path / "tiny.py"), train)
  out = subprocess.run([sys.executable, "train.py", "--workdir=gs://no-such-bucket/run", f"--config={config}"],
                       cwd=launch_util.REPO_ROOT, capture_output=True, text=True, env=launch_util.env(), timeout=300)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert out.stderr.strip().splitlines()[-1] == (
      "train: error: --workdir=gs://no-such-bucket/run: the bucket gs://no-such-bucket does not exist (or is not "
      "visible to these credentials)")


def test_a_same_size_edit_of_a_training_object_in_a_bucket_is_refused(bucket, tmp_path):
  """The checkpoint records a bucket training file by its URL (not the per-host copy), size and crc32c."""
  import tiny
  from elmo_jax.training import input as input_lib, preflight
  text = bucket + "/text/train.txt"
  storage.upload(launch_util.write_corpus(str(tmp_path / "train.txt")), text)
  config = tiny.train_config(text)
  meta = tmp_path / "run" / "checkpoints" / "40" / "meta"
  meta.mkdir(parents=True)
  source = input_lib.train_source(config.data)
  assert [f["path"] for f in source["files"]] == [text] and source["files"][0]["crc32c"]
  meta.joinpath("metadata").write_text(json.dumps({"config": config.to_dict(), "vocab_sha256": "x", "data": [{}],
                                                    "train_source": source}))
  preflight.check_run(config, str(tmp_path / "run"), 1, 1)
  storage.write_bytes(text, storage.read_bytes(text))  # uploaded again unchanged (a new generation): resumes
  preflight.check_run(config, str(tmp_path / "run"), 1, 1)
  data = storage.read_bytes(text)
  storage.write_bytes(text, data.replace(b"the", b"The", 1))
  with pytest.raises(preflight.PreflightError, match=rf"config.data.train_files: {text} changed since \(the same "
                     rf"{len(data):,} bytes, other content: crc32c \S+ then, \S+ now\) \(checkpoint step 40"):
    preflight.check_run(config, str(tmp_path / "run"), 1, 1)
