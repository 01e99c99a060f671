"""Prepared corpora are verified on every open, and `prepare` refuses bad inputs and leaves nothing behind.

One test per row of the issues: mangled ids (same size, and same size *and* mtime), a truncated file, a
damaged manifest (all read through the one opener, `manifest.open_verified`: `PreparedCorpus`, the trainer's
input, evaluate's reader, `prepare`'s rerun); binary input; leftovers of a refused input; the difference
message; Ctrl-C; a corpus without tokens.

The verification cache trusts a file whose (size, mtime_ns, ctime_ns) equal those recorded after its last
successful sha256: a byte flip changes the mtime, and restoring the mtime with os.utime still changes the
ctime, so both are found. The file-system clock is coarse (a few ms), so the tests wait a little between
caching a file's check and editing it, as any real edit comes later than that.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from elmo_jax.data import TextSource
from elmo_jax.data import prepare as prepare_lib
from elmo_jax.data.manifest import (PARTIAL, NotPreparedError, PrepareError, PreparedCorpusError, open_verified,
                                    verify)
from elmo_jax.data.prepare import prepare
from elmo_jax.data.prepared import PreparedCorpus

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the cat sat on a mat , dog ran far away under big small red tree house river boat sun .".split()
QUIET = dict(log_line=lambda _: None)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))


def _corpus(path, n=300, seed=0):
  rng = np.random.RandomState(seed)
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(n):
      f.write(" ".join(rng.choice(WORDS, rng.randint(1, 12))) + "\n")
  return str(path)


def _prepared(tmp_path, name="p"):
  out = str(tmp_path / name)
  prepare(out, [_corpus(tmp_path / f"{name}.txt")], **QUIET)
  return out


def _flip(path, offset=-1):
  """Changes one byte, keeping the size (the mtime moves)."""
  time.sleep(0.05)  # later than the cached check by more than the clock's granularity
  with open(path, "r+b") as f:
    f.seek(offset, 2)
    byte = f.read(1)
    f.seek(offset, 2)
    f.write(bytes([byte[0] ^ 1]))


def _one_line(e) -> str:
  message = str(e.value if hasattr(e, "value") else e)
  assert "\n" not in message and "Traceback" not in message, message
  return message


def _readers(directory):
  """Every way into a prepared directory: each must refuse with the same one-line error."""
  from elmo_jax.evaluation import perplexity  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.config import base_config  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.input import make_input  # pylint: disable=g-import-not-at-top

  def train():
    config = base_config()
    config.data.prepared_dir = directory
    make_input(config, os.path.join(os.path.dirname(directory), "workdir"), 2)

  return {"PreparedCorpus": lambda: PreparedCorpus(directory), "trainer": train,
          "evaluate --text_file": lambda: perplexity.open_source(directory, None, "train"),
          "prepare rerun": lambda: prepare(directory, [directory + ".txt"], **QUIET)}


def _assert_all_refuse(directory, pattern):
  for name, read in _readers(directory).items():
    with pytest.raises(OSError) as e:  # PreparedCorpusError: also an OSError, which evaluate.py prints in one line
      read()
    assert isinstance(e.value, PreparedCorpusError), name
    assert re.search(pattern, _one_line(e)), (name, str(e.value))


def test_flipped_ids_of_the_same_size_are_refused_by_every_reader(tmp_path):
  """Row 1: bytes of tokens.npy edited (size kept): train, evaluate and prepare's rerun all refuse."""
  d = _prepared(tmp_path)
  assert len(PreparedCorpus(d)) == 300  # verified (the cache prepare seeded vouches for every file)
  _flip(os.path.join(d, "tokens.npy"))
  _assert_all_refuse(d, rf"^{d}/tokens.npy fails its sha256 checksum .*manifest.json.*prepare it again")
  assert "tokens.npy fails its sha256" in verify(d)


def test_an_edit_with_its_mtime_restored_is_still_found(tmp_path):
  """Row 1, the cache's key: (size, mtime_ns, ctime_ns); os.utime can restore the mtime, not the ctime."""
  d = _prepared(tmp_path)
  PreparedCorpus(d, **QUIET)
  path = os.path.join(d, "tokens.npy")
  st = os.stat(path)
  _flip(path, offset=-5)
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert (os.stat(path).st_size, os.stat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
  with pytest.raises(PreparedCorpusError, match="tokens.npy fails its sha256"):
    PreparedCorpus(d, **QUIET)


def test_an_unchanged_directory_is_hashed_once_and_never_written(tmp_path):
  """Row 1: the checksums are cached by file (size, mtime, ctime) under $ELMO_JAX_CACHE, keyed by the
  directory's real path; opening writes nothing into the (possibly read-only) directory."""
  d = _prepared(tmp_path)
  cache = glob.glob(str(tmp_path / "cache" / "prepared-verified" / "*.json"))
  assert len(cache) == 1 and json.load(open(cache[0]))["directory"] == os.path.realpath(d)
  os.remove(cache[0])
  before = {n: os.stat(os.path.join(d, n)).st_mtime_ns for n in os.listdir(d)}
  os.chmod(d, 0o555)
  try:
    lines = []
    PreparedCorpus(d, log_line=lines.append)  # no cache: hashes and says so
    assert len(lines) == 1 and lines[0].startswith(f"verified {d}: sha256 of 7 of 7 files"), lines
    assert "prepared-verified" in lines[0]
    lines.clear()
    PreparedCorpus(d, log_line=lines.append)
    open_verified(d, log_line=lines.append)
    assert lines == []  # trusted from the cache
  finally:
    os.chmod(d, 0o755)
  assert {n: os.stat(os.path.join(d, n)).st_mtime_ns for n in os.listdir(d)} == before


def test_a_truncated_file_is_one_line(tmp_path):
  """Row 1: a truncated tokens.npy (a traceback from np.load before) is refused by its size, without hashing;
  in a manifest without sizes (written before they were recorded), by its sha256."""
  d = _prepared(tmp_path)
  path = os.path.join(d, "tokens.npy")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size - 8)
  _assert_all_refuse(d, rf"^{path} is {size - 8:,} bytes, manifest.json records {size:,} \(truncated")
  manifest_path = os.path.join(d, "manifest.json")
  manifest = json.load(open(manifest_path))
  del manifest["sizes"]
  json.dump(manifest, open(manifest_path, "w"))
  with pytest.raises(PreparedCorpusError, match="tokens.npy fails its sha256"):
    PreparedCorpus(d, **QUIET)
  os.remove(path)
  with pytest.raises(PreparedCorpusError, match=r"tokens.npy is missing \(listed in manifest.json\)"):
    PreparedCorpus(d, **QUIET)


@pytest.mark.parametrize("garbage, message", [
    (b"{not json", r"manifest.json is not valid JSON \("),
    (b"\x89HDF\r\n\x1a\n\x00\x00", r"manifest.json is not UTF-8 text"),
    (b"[1, 2]", r"manifest.json is not a prepared corpus's manifest \(a JSON list"),
    (b'{"settings": {}, "counts": {}, "sha256": {}}', r"manifest.json is of format_version null"),
])
def test_a_damaged_manifest_is_one_line(tmp_path, garbage, message):
  """Row 1: a manifest that is not JSON (a traceback before), or not of this format."""
  d = _prepared(tmp_path)
  with open(os.path.join(d, "manifest.json"), "wb") as f:
    f.write(garbage)
  _assert_all_refuse(d, message)


def test_no_manifest_is_still_a_file_not_found(tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="not a prepared corpus"):
    PreparedCorpus(str(tmp_path / "empty"))
  with pytest.raises(NotPreparedError, match="no such directory"):
    open_verified(str(tmp_path / "nowhere"))


def test_binary_input_is_refused_before_anything_is_created(tmp_path):
  """Row 2: an HDF5 file as input (83 'sentences' and a warning before); a file most of whose lines are not
  UTF-8 (its first 4 kB clean) is refused naming the count and the first bad line, by prepare and by
  TextSource (the trainer's raw-text input) alike."""
  h5py = pytest.importorskip("h5py")
  h5 = str(tmp_path / "weights.hdf5")
  with h5py.File(h5, "w") as f:
    f["w"] = np.random.RandomState(0).randn(5000, 16).astype(np.float32)
  out = tmp_path / "o"
  with pytest.raises(PrepareError) as e:
    prepare(str(out), [h5], **QUIET)
  assert _one_line(e) == f"{h5} is an HDF5 file, not text"
  assert not out.exists()
  latin = tmp_path / "latin1.txt"
  latin.write_bytes(b"a clean line .\n" * 300 + "caf\u00e9 na\u00efve .\n".encode("latin-1") * 400)
  with pytest.raises(PrepareError) as e:
    prepare(str(out), [str(latin)], **QUIET)
  assert _one_line(e) == (f"{latin}: 400 of its 700 non-empty lines are not valid UTF-8 (first at {latin}:301): "
                          "binary data or another encoding, not a text corpus")
  assert not out.exists()
  with pytest.raises(ValueError, match="400 of its 700 non-empty lines"):
    TextSource(str(latin))
  mostly_good = tmp_path / "ok.txt"
  mostly_good.write_bytes(b"a clean line .\n" * 300 + b"bad \xff line\n" * 10)
  assert len(TextSource(str(mostly_good))) == 300  # a few bad lines are still skipped, not refused


def test_a_refused_input_leaves_nothing_that_blocks_the_next_run(tmp_path):
  """Row 3: a zero-byte input was refused but left .partial/settings.json, so the next prepare into that
  directory was refused as another corpus's unfinished preparation."""
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  out = tmp_path / "o"
  with pytest.raises(PrepareError) as e:
    prepare(str(out), [str(empty)], chunk_sentences=2000, **QUIET)
  assert _one_line(e) == f"input {empty} is empty (0 bytes)"
  assert not out.exists()
  manifest = prepare(str(out), [_corpus(tmp_path / "good.txt")], **QUIET)
  assert manifest["counts"]["n_sentences"] == 300 and not (out / PARTIAL).exists()


def test_an_unfinished_preparation_names_the_corpus_difference_first(tmp_path, monkeypatch):
  """Row 3: the message cited `chunk_sentences is 2000 there, 100000 here` instead of the other corpus."""
  a, b = _corpus(tmp_path / "a.txt"), _corpus(tmp_path / "b.txt", seed=1)
  out = str(tmp_path / "o")

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  with monkeypatch.context() as m:
    m.setattr(prepare_lib, "_merge", interrupted)
    with pytest.raises(KeyboardInterrupt):
      prepare(out, [a], chunk_sentences=2000, **QUIET)
  assert os.path.exists(os.path.join(out, PARTIAL, "settings.json"))
  with pytest.raises(PrepareError) as e:
    prepare(out, [b], **QUIET)
  assert _one_line(e).startswith(f"{out} holds an unfinished preparation of another corpus (source is {a} there, "
                                 f"{b} here)")
  assert "chunk_sentences" not in str(e.value)
  with pytest.raises(PrepareError) as e:
    prepare(out, [a], pretokenized=True, **QUIET)
  assert "unfinished preparation of other settings (tokenizer.pretokenized is false there" in _one_line(e)
  with pytest.raises(PrepareError) as e:
    prepare(out, [a], **QUIET)
  assert "rerun with --chunk_sentences=2000 to resume it" in _one_line(e)
  assert prepare(out, [a], chunk_sentences=2000, **QUIET)["counts"]["n_sentences"] == 300  # resumes


@pytest.mark.parametrize("content, pretokenized, message", [
    ("\n" * 200_000, False, "has no usable lines"),  # blank lines: TextSource finds no line
    ("\u00a0 \u3000\n" * 20_000, True, "has no tokens"),  # lines of Unicode spaces: no token after splitting
])
def test_a_corpus_without_tokens_leaves_no_partial(tmp_path, content, pretokenized, message):
  """Row 5: 2.2 MB of blank lines: the PrepareError left `.partial` behind (in the trainer's auto-prepare
  folder too)."""
  text = tmp_path / "blank.txt"
  text.write_text(content, encoding="utf-8")
  out = tmp_path / "o"
  with pytest.raises(PrepareError, match=message) as e:
    prepare(str(out), [str(text)], pretokenized=pretokenized, chunk_sentences=5000, **QUIET)
  _one_line(e)
  assert not out.exists()
  out.mkdir()  # a directory the user made stays, empty
  with pytest.raises(PrepareError, match=message):
    prepare(str(out), [str(text)], pretokenized=pretokenized, chunk_sentences=5000, **QUIET)
  assert os.listdir(out) == []


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_the_rerun_resumes(tmp_path):
  """Row 4: Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during a 2-worker prepare
  printed 3 tracebacks; now one line, exit 130, and the finished chunks are resumed."""
  text = _corpus(tmp_path / "big.txt", n=80_000)
  env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
  cli = [sys.executable, "-m", "elmo_jax.data.prepare", "--noprogress", f"--input={text}",
         f"--output_dir={tmp_path}/o", "--chunk_sentences=500", "--num_workers=2"]
  run = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
  partial = tmp_path / "o" / PARTIAL
  deadline = time.time() + 120
  while time.time() < deadline and len(glob.glob(str(partial / "chunk-*[0-9].npz"))) < 4 and run.poll() is None:
    time.sleep(0.02)
  assert run.poll() is None, "finished before it could be interrupted"
  os.killpg(run.pid, signal.SIGINT)
  _, err = run.communicate(timeout=60)
  assert run.returncode == 130, err
  assert "Traceback" not in err
  assert err.strip().splitlines() == [f"prepare: interrupted; rerun the same command to resume (finished chunks are "
                                      f"kept in {partial})"]
  kept = len(glob.glob(str(partial / "chunk-*[0-9].npz")))
  assert 4 <= kept < 160
  done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert f"resuming: kept {kept} of 160 finished chunks" in done.stdout
  assert verify(str(tmp_path / "o")) is None
