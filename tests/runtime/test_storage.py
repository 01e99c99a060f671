"""elmo_jax.runtime.storage against a real GCS server (tests/gcs_util.py): copies, mirrors, staged outputs."""
from __future__ import annotations

import json
import os
import re

import pytest

from elmo_jax.runtime import gcs
from elmo_jax.runtime import mirror
from elmo_jax.runtime import storage
import gcs_util

pytestmark = pytest.mark.slow
gcs_server, bucket = gcs_util.gcs_server, gcs_util.bucket  # the fixtures


def test_local_copy_downloads_once_and_follows_the_bucket(bucket, tmp_path):
  folder = tmp_path / "src"
  (folder / "sub").mkdir(parents=True)
  (folder / "a.txt").write_text("one\n")
  (folder / "sub" / "b.txt").write_text("two\n")
  storage.upload(str(folder), bucket + "/data")
  local = storage.local(bucket + "/data")
  assert open(os.path.join(local, "sub", "b.txt")).read() == "two\n"
  before = os.stat(os.path.join(local, "a.txt")).st_mtime_ns
  assert storage.local(bucket + "/data") == local
  assert os.stat(os.path.join(local, "a.txt")).st_mtime_ns == before  # unchanged: not downloaded again
  storage.write_bytes(bucket + "/data/a.txt", b"changed\n")
  storage.remove(bucket + "/data/sub/b.txt")
  storage.local(bucket + "/data")
  assert open(os.path.join(local, "a.txt")).read() == "changed\n"
  assert not os.path.exists(os.path.join(local, "sub", "b.txt"))
  one = storage.local(bucket + "/data/a.txt")
  assert open(one).read() == "changed\n"
  with pytest.raises(FileNotFoundError, match="no such object"):
    storage.local(bucket + "/nothing")


def test_mirror_push_uploads_changes_and_pull_rolls_back(bucket, tmp_path):
  copy = mirror.Mirror(bucket + "/run", str(tmp_path / "m"), skip=("checkpoints",))
  copy.pull()
  (tmp_path / "m" / "metrics.jsonl").write_text('{"step": 1}\n')
  copy.push("metrics.jsonl")
  assert storage.read_bytes(bucket + "/run/metrics.jsonl") == b'{"step": 1}\n'
  with open(tmp_path / "m" / "metrics.jsonl", "a") as f:
    f.write('{"step": 2}\n')  # written, never pushed (the process was killed)
  (tmp_path / "m" / "stray.txt").write_text("x")
  storage.write_bytes(bucket + "/run/checkpoints/1/x", b"ckpt")
  copy.pull()
  assert (tmp_path / "m" / "metrics.jsonl").read_text() == '{"step": 1}\n'
  assert not (tmp_path / "m" / "stray.txt").exists()
  assert not (tmp_path / "m" / "checkpoints").exists()


def test_another_process_write_probe_is_never_pulled_or_listed(bucket, tmp_path):
  """A pod's process 1 checks that it may write the bucket workdir (an empty probe object, removed at once)
  while process 0 pulls it: the probe is not content. (A pull that listed it, then found it gone, failed.)"""
  storage.write_bytes(bucket + "/run/config.json", b"{}")
  storage.write_bytes(bucket + "/run/.write-test-123-456", b"")  # listed here, as if caught mid-check
  copy = mirror.Mirror(bucket + "/run", str(tmp_path / "m"))
  copy.pull()
  assert sorted(n for n in os.listdir(tmp_path / "m") if n != storage.RECORD) == ["config.json"]
  assert storage.listdir(bucket + "/run") == ["config.json"]
  storage.check_output(bucket + "/run/out", "--output")  # its own probe leaves nothing behind either
  assert storage.listdir(bucket + "/run") == ["config.json"]


def test_staged_output_reaches_the_bucket_only_on_success(bucket):
  with pytest.raises(RuntimeError):
    with storage.staged_output(bucket + "/out/e.hdf5", "--output_file") as path:
      open(path, "w").write("half")
      raise RuntimeError("stopped")
  assert not storage.exists(bucket + "/out/e.hdf5")
  with storage.staged_output(bucket + "/out/e.hdf5", "--output_file") as path:
    open(path, "w").write("whole")
  assert storage.read_bytes(bucket + "/out/e.hdf5") == b"whole"


def test_digests_of_a_bucket_folder_match_the_local_files(bucket, tmp_path):
  (tmp_path / "d").mkdir()
  (tmp_path / "d" / "x.bin").write_bytes(os.urandom(1000))
  storage.upload(str(tmp_path / "d"), bucket + "/d")
  assert storage.tree_digests(bucket + "/d", "crc32c") == storage.tree_digests(str(tmp_path / "d"), "crc32c")
  assert storage.tree_digests(bucket + "/d", "sha256") == storage.tree_digests(str(tmp_path / "d"), "sha256")


def test_missing_bucket_is_one_line(gcs_server, monkeypatch):
  for key, value in gcs_server.env.items():
    monkeypatch.setenv(key, value)
  with pytest.raises(storage.StorageError, match="gs://no-such-bucket does not exist"):
    storage.check_remote_output("gs://no-such-bucket/run", "--workdir", directory=True)


def test_bucket_outputs_follow_the_local_output_rules(bucket):
  from elmo_jax.runtime import files
  storage.write_bytes(bucket + "/run/config.json", b"{}")  # a trained run's folder
  with pytest.raises(files.UnsafeOutputError, match=r"is inside the trained run gs://\S+/run's export/ folder"):
    storage.check_output(bucket + "/run/export/e.hdf5", "--output_file")
  with pytest.raises(files.UnsafeOutputError, match="is an input of this run"):
    storage.check_output(bucket + "/t.txt", "--output_file", inputs=[bucket + "/t.txt"])
  with pytest.raises(files.UnsafeOutputError, match="holds an input of this run"):
    storage.check_output(bucket + "/d", "--output_dir", inputs=[bucket + "/d/t.txt"], directory=True, replaces=True)
  storage.check_output(bucket + "/out/e.hdf5", "--output_file", inputs=[bucket + "/t.txt"])
  assert storage.listdir(bucket) == ["run"]  # the write probe is gone, and was never under out/e.hdf5/


def test_tfds_data_dir_in_a_bucket_reads_like_the_local_one(bucket, tmp_path):
  from elmo_jax.data.sources import TfdsSource
  from elmo_jax.evaluation import readers
  from tfds_util import TinySst2
  local = str(tmp_path / "tfds")
  TinySst2(data_dir=local, file_format="array_record").download_and_prepare()
  storage.upload(local, bucket + "/tfds")
  here, there = TfdsSource("tiny_sst2", "train", data_dir=local, text_key="sentence"), TfdsSource(
      "tiny_sst2", "train", data_dir=bucket + "/tfds", text_key="sentence")
  assert len(there) == len(here) == 120
  assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))]
  assert (readers.read_tfds_labelled("tfds:tiny_sst2:validation", bucket + "/tfds")
          == readers.read_tfds_labelled("tfds:tiny_sst2:validation", local))


def test_without_gcsfs_a_bucket_path_is_one_line(monkeypatch):
  import sys
  monkeypatch.setitem(sys.modules, "gcsfs", None)  # import fails as when it is not installed
  gcs.filesystem.cache_clear()  # pylint: disable=protected-access
  try:
    with pytest.raises(storage.StorageError, match=r"gs:// paths need gcsfs: pip install gcsfs"):
      storage.exists("gs://bucket/run")
  finally:
    gcs.filesystem.cache_clear()  # pylint: disable=protected-access
  assert storage.exists(__file__)  # local paths never touch it


def test_text_files_in_a_bucket_read_like_local_ones(bucket, tmp_path):
  from elmo_jax.data.sources import TextSource, expand_paths
  (tmp_path / "a.txt").write_text("the cat sat\non a mat\n")
  storage.upload(str(tmp_path / "a.txt"), bucket + "/text/a.txt")
  there, here = TextSource([bucket + "/text/a.txt"]), TextSource([str(tmp_path / "a.txt")])
  assert [there[i] for i in range(len(there))] == [here[i] for i in range(len(here))] == ["the cat sat", "on a mat"]
  with pytest.raises(FileNotFoundError, match="patterns are not expanded in a bucket"):
    expand_paths([bucket + "/text/*.txt"])
  with pytest.raises(FileNotFoundError, match="no such object"):
    expand_paths([bucket + "/text/b.txt"])


def test_a_bucket_path_a_client_reads_as_syntax_is_refused_before_anything_is_written(bucket, tmp_path):
  """'#' would cut tensorstore's URL (the arrays of every step in an OCDBT database at a parent prefix), '?' starts
  its query, '*?[]' are gcsfs's globs (a move takes other objects): refused in one line naming the flag and the
  character, by the preflight's first check, and by every client call (`gcs.key`) and checkpoint."""
  import tiny
  from elmo_jax.training import preflight
  from elmo_jax.training.checkpoint import Checkpointer
  train = tmp_path / "train.txt"
  train.write_text("the cat sat on the mat .\n" * 20)
  config = tiny.train_config(str(train))
  for name, char in (("odd dir#1?x=ü/run", "'#'"), ("a?b/run", "'?'"), ("runs/*", "'\\*'"), ("r[1]", "'\\['"),
                     ("line\nbreak", "a control character")):
    url = f"{bucket}/{name}"
    with pytest.raises(preflight.PreflightError, match=rf"^--workdir={re.escape(url)}: {char}") as refused:
      preflight.check(config, url)
    assert "\n" not in str(refused.value).replace(url, "")
  with pytest.raises(storage.StorageError, match="'#' in a bucket path: tensorstore"):
    Checkpointer(bucket + "/x#y/checkpoints")
  with pytest.raises(storage.StorageError, match=r"'\[' in a bucket path"):
    storage.local(bucket + "/corpus[1].txt")
  assert storage.listdir(bucket) == []  # not even the write probe
  fine = f"{bucket}/odd dir %41 ü+=;@,~/run"  # names to every client
  storage.check_output(fine, "--workdir", directory=True)
  assert storage.listdir(bucket) == []


def test_a_bucket_checkpoint_keeps_every_object_a_restore_reads_in_its_step_folder_and_checksum(bucket):
  """Orbax's OCDBT databases (manifest.ocdbt, d/, ocdbt.process_N/) lie under checkpoints/<step>/, so the step's
  crc32c record covers every object the restore reads; a deleted array object is found before a restore."""
  import jax.numpy as jnp
  from elmo_jax.training.checkpoint import Checkpointer
  run = f"{bucket}/odd dir %41 ü/run"
  ckpt = Checkpointer(run + "/checkpoints", keep=2)
  try:
    ckpt.save(1, {"w": jnp.arange(12.0).reshape(4, 3)}, {"x": 1})
    ckpt.wait()
    every = sorted(storage.list_objects(bucket))  # pylint: disable=protected-access
    prefix = "odd dir %41 ü/run/checkpoints/"
    assert all(name.startswith(prefix) for name in every), every
    record = json.loads(storage.read_bytes(run + "/checkpoints/checksums/1.json"))["crc32c"]
    in_step = sorted(name[len(prefix) + 2:] for name in every if name.startswith(prefix + "1/"))
    assert sorted(record) == in_step
    arrays = [rel for rel in record if "/d/" in "/" + rel]
    assert "state/manifest.ocdbt" in record and arrays, record
    assert ckpt.verify(1) is None
    storage.remove(f"{run}/checkpoints/1/{arrays[0]}")
    assert ckpt.verify(1) == f"file {arrays[0]} is missing"
  finally:
    ckpt.manager.close()


@pytest.mark.parametrize("name", ["corp/../../../../escaped.txt", "corp/%2e%2e/%2e%2e/%2e%2e/escaped.txt",
                                  "corp/..\\..\\escaped.txt"])
def test_a_bucket_object_named_out_of_its_folder_is_refused_not_written_outside_the_cache(
    gcs_server, bucket, tmp_path, name):
  """An object's name is a name (`outside_names.inside`): copying the folder `corp` refuses one whose name climbs
  out, in one line, and writes nothing outside `$ELMO_JAX_CACHE`."""
  import urllib.parse
  import urllib.request
  for obj in ("corp/ok.txt", name):  # the JSON API takes any name (gcsfs would normalise it)
    url = (f"{gcs_server.url}/upload/storage/v1/b/{bucket[len('gs://'):]}/o?uploadType=media&name="
           f"{urllib.parse.quote(obj, safe='')}")
    urllib.request.urlopen(urllib.request.Request(url, data=b"x\n", method="POST")).read()
  with pytest.raises(storage.StorageError, match=r"bucket object .* (climbs out|backslash)"):
    storage.local(bucket + "/corp")
  assert not [p for p in tmp_path.rglob("escaped.txt")]


def test_a_model_that_convert_wrote_to_a_bucket_is_read_back_by_model(bucket):
  """`--model=gs://...` refused what `convert --to=gs://...` had just written."""
  from elmo_jax.sources import convert  # pylint: disable=g-import-not-at-top
  from elmo_jax.sources import pretrained  # pylint: disable=g-import-not-at-top
  from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  local = os.path.join(os.environ["ELMO_JAX_CACHE"], "..", "src")
  os.makedirs(local)
  shutil.copy(FIXTURE_OPTIONS, os.path.join(local, "options.json"))
  shutil.copy(FIXTURE_WEIGHTS, os.path.join(local, "weights.hdf5"))
  convert.convert(local, bucket + "/model")
  found = pretrained.resolve_model(bucket + "/model")
  assert found.path == bucket + "/model" and os.path.basename(found.weight_file) == "weights.hdf5"
  assert pretrained.load(bucket + "/model")[0] == pretrained.load(local)[0]
