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

import launch_util

from elmo_jax.data import TextSource
from elmo_jax.data import prepare as prepare_lib
from elmo_jax.data.manifest import (PARTIAL, NotPreparedError, PrepareError, PreparedCorpusError, open_verified,
                                    verify)
from elmo_jax.data.prepare import prepare
from elmo_jax.data.prepared import PreparedCorpus
from paths import REPO_ROOT

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
  env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  cli = [sys.executable, "-m", "elmo_jax", "prepare", "--noprogress", f"--input={text}",
         f"--output_dir={tmp_path}/o", "--chunk_sentences=500", "--num_workers=2"]
  run = launch_util.popen_interruptible(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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


# --- the tester's faults T45/P11, P01/P02, T36/T35, P03/P04, P07 -----------------------------------------
def _bilm_vocab(path, words=("the", "cat", "zebra")):
  """A plain bilm-tf vocab file: tokens only, the specials among them, no vocab_counts.tsv beside it."""
  path.write_text("<S>\n</S>\n<UNK>\n" + "".join(w + "\n" for w in words), encoding="utf-8")
  assert not (path.parent / "vocab_counts.tsv").exists()
  return str(path)


def test_a_vocab_file_without_counts_prepares(tmp_path):
  """T45/P11: a vocab file without vocab_counts.tsv beside it crashed prepare (FileNotFoundError from the
  manifest, .partial left). Now the prepared vocabulary is the file's tokens in its order (the same sha256
  as `Vocab.load(vocab_file)`, so a workdir trained from the file resumes) with their counts in the corpus."""
  from elmo_jax.data import Vocab  # pylint: disable=g-import-not-at-top
  (tmp_path / "v").mkdir()
  v = _bilm_vocab(tmp_path / "v" / "v.txt")
  text = _corpus(tmp_path / "train.txt")
  out = tmp_path / "o"
  manifest = prepare(str(out), [text], vocab_file=v, **QUIET)
  assert not (out / PARTIAL).exists() and verify(str(out)) is None
  vocab, wanted = PreparedCorpus(str(out), **QUIET).vocab(), Vocab.load(v)
  assert vocab.tokens == wanted.tokens and vocab.sha256() == wanted.sha256() == manifest["counts"]["vocab_sha256"]
  words = [w for line in open(text, encoding="utf-8") for w in line.split()]
  n_unk = sum(w not in ("the", "cat") for w in words)
  assert vocab.counts.tolist() == [0, 300, n_unk, words.count("the"), words.count("cat"), 0]
  assert manifest["counts"]["oov_tokens"] == n_unk
  assert prepare(str(out), [text], vocab_file=v, **QUIET) == manifest  # the rerun verifies, nothing to do


def test_the_trainer_input_from_a_vocab_file_without_counts(tmp_path):
  """T45/P11 in the trainer (auto-prepare): trains from the file's vocabulary, resumes with it, and an edited
  vocab file prepares anew (it was refused as 'an unfinished preparation of other settings' / another corpus,
  its folder keyed by the file's path alone)."""
  from elmo_jax.data import Vocab  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.config import base_config  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.input import _auto_prepare, make_input  # pylint: disable=g-import-not-at-top
  v = _bilm_vocab(tmp_path / "v.txt")
  config = base_config()
  config.data.train_files, config.data.eval_files, config.data.vocab_file = _corpus(tmp_path / "t.txt"), "", v
  config.unroll_steps = 5
  workdir = str(tmp_path / "workdir")
  for _ in range(2):  # the second start resumes from the workdir's vocab.txt
    run = make_input(config, workdir, 2)
    assert run.vocab.sha256() == Vocab.load(v).sha256() and run.description.startswith("prepared corpus")
    assert next(run.train())["fwd_targets"].shape == (2, 5)
  before, _ = _auto_prepare(config, workdir)
  _bilm_vocab(tmp_path / "v.txt", words=("the", "dog"))
  after, _ = _auto_prepare(config, workdir)
  assert after != before and PreparedCorpus(after, **QUIET).vocab().tokens == Vocab.load(v).tokens


def test_a_refusal_inside_the_trainer_names_no_prepare_flag(tmp_path):
  """T45/P11: a prepare refusal said 'use another --output_dir', a flag a trainer user never passed."""
  text, other = _corpus(tmp_path / "a.txt"), _corpus(tmp_path / "b.txt", seed=1)
  out = str(tmp_path / "o")
  prepare(out, [text], **QUIET)
  with pytest.raises(PrepareError) as e:
    prepare(out, [other], **QUIET)
  assert _one_line(e).endswith(f"; prepare into another directory or delete {out}") and "--" not in str(e.value)
  (tmp_path / "file").write_text("x")
  with pytest.raises(PrepareError) as e:
    prepare(str(tmp_path / "file"), [text], **QUIET)
  assert _one_line(e) == f"output directory {tmp_path / 'file'} is a file, not a directory"


@pytest.mark.parametrize("flags, message", [
    (dict(vocab_max_size=2), r"^vocab_max_size=2: must hold <S>, </S>, <UNK> and a word \(>= 4\), or be 0 for no"),
    (dict(vocab_max_size=-10), r"^vocab_max_size=-10: must hold"),
    (dict(vocab_max_size=3), r"^vocab_max_size=3: must hold"),
    (dict(vocab_min_count=0), r"^vocab_min_count=0: must be an integer >= 1$"),
    (dict(vocab_min_count=-1), r"^vocab_min_count=-1: must be an integer >= 1$"),
    (dict(max_token_chars=0), r"^max_token_chars=0: must be an integer >= 1$"),
])
def test_a_vocab_size_without_room_for_a_word_is_refused(tmp_path, flags, message):
  """P01/P02: --vocab_max_size=2 or -10 silently built a near-full vocabulary (max_size - 3 < 0 sliced the
  ranking from its end)."""
  out = tmp_path / "o"
  with pytest.raises(PrepareError) as e:
    prepare(str(out), [_corpus(tmp_path / "t.txt")], **flags, **QUIET)
  assert re.search(message, _one_line(e)), str(e.value)
  assert not out.exists()


def test_vocab_max_size_0_is_no_limit_and_4_is_one_word(tmp_path):
  """P01/P02: 0 is the CLI's documented 'all' (as None); 4 keeps the specials and the most frequent word."""
  text = _corpus(tmp_path / "t.txt")
  every = prepare(str(tmp_path / "none"), [text], vocab_max_size=None, **QUIET)
  assert prepare(str(tmp_path / "zero"), [text], vocab_max_size=0, **QUIET)["counts"] == every["counts"]
  assert every["counts"]["vocab_size"] == len(set(WORDS)) + 3
  prepare(str(tmp_path / "four"), [text], vocab_max_size=4, **QUIET)
  assert len(PreparedCorpus(str(tmp_path / "four"), **QUIET).vocab()) == 4


def test_the_cli_refuses_a_negative_vocab_size(tmp_path):
  """P01/P02 through the CLI (0 there means no limit; a negative size is not 'no limit')."""
  env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  text = _corpus(tmp_path / "t.txt")
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "prepare", "--noprogress", f"--input={text}",
                         f"--output_dir={tmp_path}/o", "--vocab_max_size=-10"],
                        env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
      "prepare: vocab_max_size=-10: must hold <S>, </S>, <UNK> and a word (>= 4), or be 0 for no limit"], proc.stderr
  assert not (tmp_path / "o").exists()


def _edit_manifest(directory, edit):
  path = os.path.join(directory, "manifest.json")
  time.sleep(0.05)  # later than the cached check by more than the clock's granularity
  manifest = json.load(open(path))
  edit(manifest)
  with open(path, "w") as f:
    json.dump(manifest, f, indent=2, sort_keys=True)


def _set(*keys_and_value):
  *keys, value = keys_and_value

  def edit(manifest):
    node = manifest
    for key in keys[:-1]:
      node = node[key]
    if value is KeyError:
      del node[keys[-1]]
    else:
      node[keys[-1]] = value
  return edit


@pytest.mark.parametrize("edit, message", [
    (_set("settings", "tokenizer", {}), r"has settings.tokenizer.pretokenized = null, not true or false"),
    (_set("settings", "tokenizer", "moses"), r"has settings.tokenizer = \"moses\", not an object"),
    (_set("settings", "tokenizer", "pretokenized", 0), r"has settings.tokenizer.pretokenized = 0, not true or false"),
    (_set("settings", "tokenizer", "lang", 5), r"has settings.tokenizer.lang = 5, not a language code"),
    (_set("settings", "max_token_chars", 0), r"has settings.max_token_chars = 0, not an integer >= 1"),
    (_set("settings", "max_token_chars", "50"), r"has settings.max_token_chars = \"50\", not an integer >= 1"),
    (_set("settings", "max_characters_per_token", True), r"has settings.max_characters_per_token = true, not an int"),
    (_set("settings", "vocab", {}), r"has settings.vocab.min_count = null, not an integer >= 1"),
    (_set("settings", "vocab", "max_size", 2), r"has settings.vocab.max_size = 2, not null or an integer >= 4"),
    (_set("settings", "vocab", {"file": "v.txt"}), r"has settings.vocab.sha256 = null, not a file's sha256"),
    (_set("settings", "source", KeyError), r"has settings.source = null, not a text or tfds input"),
    (_set("settings", "format_version", KeyError), r"is of format_version null"),
    (_set("counts", "oov_tokens", "many"), r"has counts.oov_tokens = \"many\", not a count"),
    (_set("counts", "n_truncated_tokens", -1), r"has counts.n_truncated_tokens = -1, not a count"),
    (_set("skipped_lines", []), r"has skipped_lines = \[\], not counts of skipped lines"),
])
def test_edited_manifest_settings_are_schema_checked(tmp_path, edit, message):
  """T36: settings.tokenizer={} in manifest.json gave a KeyError traceback later (prepared.py); every setting
  a reader uses is now checked on open, one line naming the key, by every reader."""
  d = _prepared(tmp_path)
  _edit_manifest(d, edit)
  _assert_all_refuse(d, rf"^{d}/manifest.json {message}.*; prepare it again into a new directory$")


def test_an_edited_max_token_chars_is_refused(tmp_path):
  """T35: settings.max_token_chars edited 50 -> 1 after preparing silently changed training (every target
  cut to one character): the manifest's counts no longer agree with its type table."""
  d = _prepared(tmp_path)
  PreparedCorpus(d, **QUIET)
  _edit_manifest(d, _set("settings", "max_token_chars", 1))
  with pytest.raises(PreparedCorpusError) as e:
    PreparedCorpus(d, **QUIET)
  assert re.search(r"manifest.json has settings.max_token_chars = 1, which cuts [\d,]+ tokens of types.txt, but "
                   r"counts.n_truncated_tokens = 0 \(the manifest was edited after preparing\?\); prepare it again",
                   _one_line(e)), str(e.value)


def test_an_edited_manifest_has_every_file_hashed_again(tmp_path):
  """T36/T35: the manifest cannot hash itself, but the verification cache records its stat and sha256: after
  an edit of manifest.json (even one keeping every digest), the next open hashes all the files again."""
  d = _prepared(tmp_path)
  lines = []
  PreparedCorpus(d, log_line=lines.append)
  assert lines == []  # prepare's own hashes count as the first verification
  _edit_manifest(d, _set("note", "edited"))
  PreparedCorpus(d, log_line=lines.append)
  assert len(lines) == 1 and lines[0].startswith(f"verified {d}: sha256 of 7 of 7 files"), lines
  lines.clear()
  PreparedCorpus(d, log_line=lines.append)
  assert lines == []  # verified again against the edited manifest: trusted from the cache
  cache = glob.glob(str(tmp_path / "cache" / "prepared-verified" / "*.json"))
  entry = json.load(open(cache[0]))["manifest"]
  assert entry["size"] == os.path.getsize(os.path.join(d, "manifest.json")) and len(entry["sha256"]) == 64


def test_a_vocab_file_of_the_wrong_kind_is_named(tmp_path):
  """P03/P04: an HDF5 --vocab_file said "'utf-8' codec can't decode byte 0x89" (no file name); a directory
  said "vocab file not found"."""
  text = _corpus(tmp_path / "t.txt")
  h5 = tmp_path / "w.hdf5"
  h5.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
  late = tmp_path / "late.txt"  # clean in the first 4 kB text_problem reads, then a latin-1 byte
  late.write_bytes(b"<S>\n</S>\n<UNK>\n" + b"word\n" * 1000 + "caf\u00e9\n".encode("latin-1"))
  (tmp_path / "dir").mkdir()
  cases = {str(h5): f"--vocab_file={h5} is an HDF5 file, not text",
           str(tmp_path / "dir"): f"--vocab_file={tmp_path / 'dir'} is a directory, not a vocab file",
           str(tmp_path / "nope.txt"): f"--vocab_file={tmp_path / 'nope.txt'}: file not found",
           str(late): f"--vocab_file={late} is not UTF-8 text (byte 5018 is b'\\xe9')"}
  for vocab_file, message in cases.items():
    with pytest.raises(PrepareError) as e:
      prepare(str(tmp_path / "o"), [text], vocab_file=vocab_file, **QUIET)
    assert _one_line(e) == message
    assert not (tmp_path / "o").exists()
  prepare(str(tmp_path / "p"), [text], **QUIET)
  with pytest.raises(PrepareError) as e:  # a prepared directory holds a vocab.txt: named
    prepare(str(tmp_path / "o"), [text], vocab_file=str(tmp_path / "p"), **QUIET)
  assert _one_line(e).endswith(f"is a directory, not a vocab file (give {tmp_path / 'p' / 'vocab.txt'})")


def test_cr_only_line_endings_are_refused(tmp_path):
  """P07: a corpus with CR-only (old Mac) line endings became one huge sentence, silently."""
  lf = _corpus(tmp_path / "lf.txt")
  cr = tmp_path / "cr.txt"
  cr.write_bytes(open(lf, "rb").read().replace(b"\n", b"\r"))
  out = tmp_path / "o"
  message = f"{cr} uses CR-only line endings (old Mac), it would be read as one line; convert with tr '\\r' '\\n'"
  with pytest.raises(PrepareError) as e:
    prepare(str(out), [str(cr)], **QUIET)
  assert _one_line(e) == message
  assert not out.exists()
  with pytest.raises(ValueError) as e:  # the trainer's raw-text input too
    TextSource(str(cr))
  assert _one_line(e) == message
  crlf = tmp_path / "crlf.txt"
  crlf.write_bytes(open(lf, "rb").read().replace(b"\n", b"\r\n"))
  assert len(TextSource(str(crlf))) == 300  # Windows line endings are lines
  short = tmp_path / "short.txt"
  short.write_bytes(b"one short sentence\r")  # under 1000 bytes: may be one sentence
  assert len(TextSource(str(short))) == 1
