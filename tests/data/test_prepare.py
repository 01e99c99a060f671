"""Issue 8: `python -m elmo_jax prepare`, the prepared-corpus batches (== the raw-text path's), the
prefetcher's data positions, and training from a prepared corpus (== training from raw text)."""
from __future__ import annotations

import filecmp
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from elmo_jax.data import TextSource, Tokenizer, Vocab, make_lm_iterator
from elmo_jax.data.manifest import OUTPUT_FILES, PARTIAL, PrepareError, verify
from elmo_jax.data.prepare import prepare
from elmo_jax.data.prepared import PreparedCorpus, make_prepared_iterator
from elmo_jax.training.feed import Prefetcher
from paths import REPO_ROOT

WORDS = "the cat sat on a mat , dog ran far away under big small red tree house river \" boat ( sun ) .".split()


def _corpus(path, n=400, seed=0, long_every=37, gz=False):
  """Raw text with punctuation for Moses, some over-long tokens, a blank line and a literal <S>."""
  rng = random.Random(seed)
  lines = []
  for i in range(n):
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 14))]
    if i % long_every == 5:
      words.append("x" * rng.randint(51, 70))  # cut to 50 chars, counted as truncated
    if i == 7:
      words.append("<S>")
    lines.append(" ".join(words))
  lines.insert(11, "")
  opener = gzip.open if gz else open
  with opener(path, "wt", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  return str(path)


def _assert_same_dirs(a, b):
  for name in OUTPUT_FILES + ("manifest.json",):
    assert filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False), name


def test_prepare_is_byte_identical_for_any_worker_count_and_verifies(tmp_path):
  text = _corpus(tmp_path / "train.txt.gz", gz=True)
  a = prepare(str(tmp_path / "a"), [text], num_workers=1, chunk_sentences=1000, log_line=lambda _: None)
  # Worker processes fork: do it from a fresh process, not from this JAX-initialized test process.
  env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  subprocess.run([sys.executable, "-m", "elmo_jax", "prepare", "--noprogress", f"--input={text}",
                  f"--output_dir={tmp_path / 'b'}", "--num_workers=2", "--chunk_sentences=37"],
                 env=env, check=True, capture_output=True)
  _assert_same_dirs(tmp_path / "a", tmp_path / "b")
  assert not os.path.exists(tmp_path / "a" / PARTIAL)
  assert verify(str(tmp_path / "a")) is None
  assert a["counts"]["n_sentences"] == len(TextSource(text))
  with open(tmp_path / "a" / "type_chars.npy", "r+b") as f:  # a flipped byte is found
    f.seek(-1, 2)
    byte = f.read(1)
    f.seek(-1, 2)
    f.write(bytes([byte[0] ^ 1]))
  assert "type_chars.npy fails its sha256" in verify(str(tmp_path / "a"))


def test_prepared_vocab_equals_vocab_build(tmp_path):
  text = _corpus(tmp_path / "train.txt")
  prepare(str(tmp_path / "p"), [text], vocab_max_size=20, vocab_min_count=2, log_line=lambda _: None)
  source, tok = TextSource(text), Tokenizer()
  built = Vocab.build((tok(source[i]) for i in range(len(source))), max_size=20, min_count=2)
  got = Vocab.load(str(tmp_path / "p"))
  assert got.tokens == built.tokens
  np.testing.assert_array_equal(got.counts, built.counts)
  corpus = PreparedCorpus(str(tmp_path / "p"))
  assert len(corpus.types) > len(got)  # the full type inventory: OOV words keep their own characters
  assert corpus.sentence(0) == tok(source[0])


@pytest.mark.parametrize("shard,pretokenized", [("sentences", False), ("rows", True)])
def test_prepared_batches_equal_raw_batches_and_states(tmp_path, shard, pretokenized):
  text = _corpus(tmp_path / "train.txt")
  prepare(str(tmp_path / "p"), [text], pretokenized=pretokenized, vocab_max_size=30, log_line=lambda _: None)
  corpus = PreparedCorpus(str(tmp_path / "p"))
  vocab = corpus.vocab()
  source, tok = TextSource(text), Tokenizer(pretokenized=pretokenized)
  for process_index in range(2):
    kw = dict(batch_size=4, unroll_steps=7, seed=5, process_index=process_index, process_count=2, shard=shard)
    raw = make_lm_iterator(source, vocab, tok, **kw)
    prepared = make_prepared_iterator(corpus, vocab, **kw)
    deduped = make_prepared_iterator(corpus, vocab, dedupe_shards=2, **kw)
    for k in range(150):  # > 1 epoch of this process's share
      a, b, c = next(raw), next(prepared), next(deduped)
      for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"batch {k} {key}")
      shard_of_row = np.arange(4)[:, None] // 2
      for d in ("fwd", "bwd"):
        np.testing.assert_array_equal(c["token_chars"][shard_of_row, c[f"{d}_index"]], a[f"{d}_chars"])
      np.testing.assert_array_equal(c["fwd_targets"], a["fwd_targets"])
    assert raw.get_state() == prepared.get_state()
    assert raw.get_state()["counters"]["truncated_tokens"] > 0
    # A prepared iterator resumes from a raw iterator's state (and vice versa): the same position.
    resumed = make_prepared_iterator(corpus, vocab, **kw)
    resumed.set_state(raw.get_state())
    for _ in range(5):
      a, b = next(raw), next(resumed)
      for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_finite_prepared_pass_equals_raw(tmp_path):
  text = _corpus(tmp_path / "eval.txt", n=60)
  prepare(str(tmp_path / "p"), [text], log_line=lambda _: None)
  corpus = PreparedCorpus(str(tmp_path / "p"))
  vocab = corpus.vocab()
  kw = dict(batch_size=3, unroll_steps=6, seed=0, shuffle=False, num_epochs=1, process_index=0, process_count=1)
  raw = list(make_lm_iterator(TextSource(text), vocab, Tokenizer(), **kw))
  prepared = list(make_prepared_iterator(corpus, vocab, **kw))
  assert len(raw) == len(prepared) > 5
  for a, b in zip(raw, prepared):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def test_prefetcher_states_are_those_of_the_consumed_batches(tmp_path):
  text = _corpus(tmp_path / "train.txt")
  prepare(str(tmp_path / "p"), [text], log_line=lambda _: None)
  corpus = PreparedCorpus(str(tmp_path / "p"))
  vocab = corpus.vocab()
  kw = dict(batch_size=4, unroll_steps=5, seed=1, process_index=0, process_count=1)
  reference = make_prepared_iterator(corpus, vocab, **kw)
  feed = Prefetcher(make_prepared_iterator(corpus, vocab, **kw), lambda b: b, depth=3)
  for _ in range(6):
    batch, state = feed.next()
    np.testing.assert_array_equal(batch["fwd_targets"], next(reference)["fwd_targets"])
  time.sleep(0.2)  # the producer runs ahead (3 more batches queued); the state must not include them
  feed.close()
  assert state == reference.get_state()
  resumed = make_prepared_iterator(corpus, vocab, **kw)
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["fwd_targets"], next(reference)["fwd_targets"])


def test_prefetcher_reraises_iterator_errors():
  def broken():
    yield {"x": 1}
    raise ValueError("bad line 3")

  class It:
    def __init__(self):
      self.g = broken()

    def __iter__(self):
      return self.g

    def get_state(self):
      return {}

  feed = Prefetcher(It(), lambda b: b)
  feed.next()
  with pytest.raises(ValueError, match="bad line 3"):
    feed.next()
  feed.close()


def test_refusals_are_one_line(tmp_path):
  text = _corpus(tmp_path / "train.txt")
  with pytest.raises(PrepareError, match="matches no file"):
    prepare(str(tmp_path / "o"), [str(tmp_path / "nope*.txt")])
  with pytest.raises(PrepareError, match="file not found"):
    prepare(str(tmp_path / "o"), [str(tmp_path / "nope.txt")])
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n")
  with pytest.raises(PrepareError, match="no usable lines"):
    prepare(str(tmp_path / "o2"), [str(empty)])
  bad_vocab = tmp_path / "vocab.txt"
  bad_vocab.write_text("<S>\n</S>\nthe\n")
  with pytest.raises(PrepareError, match=r"vocab.txt.*<UNK>"):
    prepare(str(tmp_path / "o3"), [text], vocab_file=str(bad_vocab))
  prepare(str(tmp_path / "p"), [text], log_line=lambda _: None)
  other = _corpus(tmp_path / "other.txt", seed=1)
  with pytest.raises(PrepareError, match=r"holds another prepared corpus \(source"):
    prepare(str(tmp_path / "p"), [other])
  with pytest.raises(PrepareError, match=r"another prepared corpus \(tokenizer.pretokenized"):
    prepare(str(tmp_path / "p"), [text], pretokenized=True)
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "notes.txt").write_text("mine")
  with pytest.raises(PrepareError, match="not empty"):
    prepare(str(tmp_path / "full"), [text])


@pytest.mark.slow
def test_cli_refusal_and_resume_after_kill9(tmp_path):
  env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  cli = [sys.executable, "-m", "elmo_jax", "prepare", "--noprogress"]
  proc = subprocess.run(cli + [f"--input={tmp_path}/missing.txt", f"--output_dir={tmp_path}/x"], env=env,
                        capture_output=True, text=True)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == [f"prepare: {tmp_path}/missing.txt: file not found"]
  text = _corpus(tmp_path / "train.txt", n=6000)
  args = [f"--input={text}", "--chunk_sentences=100", "--num_workers=1"]
  run = subprocess.Popen(cli + args + [f"--output_dir={tmp_path}/killed"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
  partial = tmp_path / "killed" / PARTIAL
  deadline = time.time() + 120
  while time.time() < deadline and len([n for n in os.listdir(partial)] if partial.exists() else []) < 6:
    time.sleep(0.05)
  run.send_signal(signal.SIGKILL)
  run.wait()
  # finished chunks only: a worker killed while writing leaves its `chunk-*.tmp.npz`, which the rerun deletes
  kept = sorted(n for n in os.listdir(partial)
                if n.startswith("chunk-") and n.endswith(".npz") and not n.endswith(".tmp.npz"))
  assert 3 <= len(kept) < 60, kept
  mtimes = {n: os.stat(partial / n).st_mtime_ns for n in kept}
  proc = subprocess.run(cli + args + [f"--output_dir={tmp_path}/killed"], env=env, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr
  assert f"kept {len(kept)} of 60 finished chunks" in proc.stdout
  prepare(str(tmp_path / "clean"), [text], num_workers=1, chunk_sentences=1000, log_line=lambda _: None)
  _assert_same_dirs(tmp_path / "killed", tmp_path / "clean")
  assert not partial.exists()
  del mtimes
  proc = subprocess.run(cli + args + [f"--output_dir={tmp_path}/killed"], env=env, capture_output=True, text=True)
  assert proc.returncode == 0 and "already prepared" in proc.stdout


@pytest.mark.slow
def test_training_from_prepared_equals_raw_for_5_steps(tmp_path):
  from elmo_jax.training.config import base_config
  from elmo_jax.training.loop import train_and_evaluate
  text = _corpus(tmp_path / "train.txt")
  evals = _corpus(tmp_path / "eval.txt", n=30, seed=3)
  losses = {}
  for name, auto_mb in (("raw", 0), ("prepared", 1024)):
    c = base_config()
    c.options.lstm.dim, c.options.lstm.projection_dim = 32, 8
    c.options.char_cnn.filters = [[1, 8], [2, 8]]
    c.options.char_cnn.embedding.dim = 4
    c.options.char_cnn.n_highway = 1
    c.batch_size, c.unroll_steps, c.num_train_steps = 4, 6, 5
    c.log_every_steps = 1
    c.eval_every_steps = c.checkpoint_every_steps = 5
    c.n_negative_samples = 0
    c.data.train_files, c.data.eval_files = text, evals
    c.data.vocab_max_size = 40
    c.data.auto_prepare_max_mb = auto_mb
    workdir = str(tmp_path / name)
    train_and_evaluate(c, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = [json.loads(line) for line in f]
    losses[name] = {k: [r[k] for r in records if k in r] for k in ("train_loss", "grad_norm", "eval_ppl",
                                                                    "unigram_ppl")}
    assert os.path.isdir(os.path.join(workdir, "prepared")) == (auto_mb > 0)
  assert len(losses["raw"]["train_loss"]) == 5
  for key, values in losses["raw"].items():
    np.testing.assert_allclose(losses["prepared"][key], values, rtol=1e-6, err_msg=key)


@pytest.mark.slow
def test_prepare_from_tfds_equals_the_same_text(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  lines = [line for line in open(_corpus(tmp_path / "train.txt", n=120), encoding="utf-8").read().split("\n")
           if line.strip()]

  class TinyPrepText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}), disable_shuffling=True)

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(lines)}

    def _generate_examples(self, rows):
      for i, row in enumerate(rows):
        yield i, {"text": row}

  TinyPrepText(data_dir=str(tmp_path / "tfds"), file_format="array_record").download_and_prepare()
  prepare(str(tmp_path / "from_tfds"), tfds_name="tiny_prep_text", tfds_data_dir=str(tmp_path / "tfds"),
          num_workers=2, chunk_sentences=50, log_line=lambda _: None)
  prepare(str(tmp_path / "from_text"), [str(tmp_path / "train.txt")], log_line=lambda _: None)
  for name in OUTPUT_FILES:  # same sentences in the same order: the same ids, types and vocabulary
    assert filecmp.cmp(tmp_path / "from_tfds" / name, tmp_path / "from_text" / name, shallow=False), name
  manifest = json.load(open(tmp_path / "from_tfds" / "manifest.json"))
  assert manifest["settings"]["source"]["kind"] == "tfds"
