"""Tests for elmo_jax.data: tokenizer, vocab, sources and the bilm-tf batch stream."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from elmo_jax.data.chars import BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, token_to_ids
from elmo_jax.data import TextSource, TfdsSource, Tokenizer, Vocab, make_lm_iterator
from paths import REPO_ROOT

PRETOK = Tokenizer(pretokenized=True)


def _corpus(n: int, seed: int = 0) -> list[str]:
  """n sentences of unique words `s{i}w{j}` with 1..7 words, so every target names its sentence."""
  rng = np.random.default_rng(seed)
  return [" ".join(f"s{i}w{j}" for j in range(rng.integers(1, 8))) for i in range(n)]


def _vocab(sentences: list[str]) -> Vocab:
  return Vocab.build(PRETOK(s) for s in sentences)


def _take(it, n: int) -> list[dict]:
  return [next(it) for _ in range(n)]


def _rows(batches: list[dict], vocab: Vocab) -> dict[str, list[list[str]]]:
  """Concatenates each row's windows back into token streams (weight-1 steps only)."""
  out = {"fwd_in": [], "fwd_tgt": [], "bwd_in": [], "bwd_tgt": []}
  char_to_token = {token_to_ids(t).tobytes(): t for t in vocab.tokens}
  for r in range(batches[0]["weights"].shape[0]):
    for key in out:
      out[key].append([])
    for batch in batches:
      for t in np.nonzero(batch["weights"][r])[0]:
        out["fwd_in"][r].append(char_to_token[batch["fwd_chars"][r, t].tobytes()])
        out["bwd_in"][r].append(char_to_token[batch["bwd_chars"][r, t].tobytes()])
        out["fwd_tgt"][r].append(vocab.tokens[batch["fwd_targets"][r, t]])
        out["bwd_tgt"][r].append(vocab.tokens[batch["bwd_targets"][r, t]])
  return out


# ---------------------------------------------------------------- vocab


def test_vocab_build_save_load_round_trip(tmp_path):
  sentences = [["a", "b", "a"], ["c", "a", "b"], ["d"]]
  vocab = Vocab.build(sentences, max_size=5)
  assert vocab.tokens == [BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, "a", "b"]  # count desc, then token; c,d cut
  assert vocab.counts.tolist() == [0, 3, 2, 3, 2]  # <UNK> = c + d, </S> = 3 sentences
  np.testing.assert_array_equal(vocab.encode(["a", "zzz", "b"]), np.array([3, 2, 4], np.int32))
  assert vocab.encode(["a"]).dtype == np.int32
  vocab.save(str(tmp_path))
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]  # temp files were renamed away
  loaded = Vocab.load(str(tmp_path))
  assert loaded.tokens == vocab.tokens and len(loaded) == 5
  assert loaded.counts.tolist() == vocab.counts.tolist()
  assert loaded.sha256() == vocab.sha256()
  assert Vocab.build(sentences, max_size=4).sha256() != vocab.sha256()
  logp = loaded.unigram_log_probs()
  assert logp[loaded.bos] == -np.inf
  np.testing.assert_allclose(np.exp(logp).sum(), 1.0)
  np.testing.assert_allclose(np.exp(logp[3]), 3 / 10)
  assert Vocab.build(sentences, min_count=2).tokens[3:] == ["a", "b"]


def test_vocab_requires_specials_and_names_file(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("<S>\n</S>\nthe\n")
  with pytest.raises(ValueError, match=r"vocab\.txt.*<UNK>"):
    Vocab.load(str(path))


def _bilm_tf_fixture(name: str) -> str:
  for root in (os.path.join(REPO_ROOT, "tests", "fixtures"), os.path.join(REPO_ROOT, "..", "shared", "peer_fixtures")):
    path = os.path.join(root, "bilm_tf", name)
    if os.path.exists(path):
      return path
  pytest.skip(f"bilm-tf fixture {name} not present")


def test_bilm_tf_vocab_files_accepted():
  path = _bilm_tf_fixture("train/vocab.txt")  # the training vocab: specials on lines 1-3
  with open(path, encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  vocab = Vocab.load(path)
  assert vocab.tokens == lines and (vocab.bos, vocab.eos, vocab.unk) == (0, 1, 2)
  assert vocab.encode([lines[5], "not-a-word-xyz"]).tolist() == [5, 2]
  assert vocab.counts is None
  with pytest.raises(ValueError, match="no counts"):
    vocab.unigram_log_probs()

  # bilm-tf's Batcher vocab has <S>, </S> mid-file and no <UNK>: inference-only, like validate_file=False.
  path = _bilm_tf_fixture("vocab_test.txt")
  with pytest.raises(ValueError, match=r"vocab_test\.txt.*<UNK>"):
    Vocab.load(path)
  vocab = Vocab.load(path, require_specials=False)
  assert (vocab.tokens[vocab.bos], vocab.tokens[vocab.eos], vocab.unk) == (BOS_TOKEN, EOS_TOKEN, -1)
  assert vocab.bos == 207 and vocab.eos == 257
  with pytest.raises(KeyError, match="not-a-word"):
    vocab.encode(["not-a-word"])
  with pytest.raises(ValueError, match="<UNK>"):
    make_lm_iterator(["a"], vocab, PRETOK, batch_size=1, unroll_steps=2, seed=0, process_index=0, process_count=1)


# ---------------------------------------------------------------- tokenizer


def test_tokenizer_moses_and_pretokenized():
  raw = 'He said "Don\'t stop," e.g. at 3.50 & <b>.'
  expected = ["He", "said", '"', "Don", "'t", "stop", ",", '"', "e.g.", "at", "3.50", "&", "<", "b", ">", "."]
  assert Tokenizer()(raw) == expected  # escape=False: no "&amp;" / "&quot;" entities
  assert PRETOK("  already  tokenized &amp; x ") == ["already", "tokenized", "&amp;", "x"]


# ---------------------------------------------------------------- sources


def test_text_source_counts_bad_lines(tmp_path):
  content = b"good line\n\xff\xfe broken\n\n   \ncaf\xc3\xa9 ok\r\n"
  (tmp_path / "a.txt").write_bytes(content)
  with gzip.open(tmp_path / "b.txt.gz", "wb") as f:
    f.write(content)
  source = TextSource(str(tmp_path / "*.txt*"))
  assert len(source) == 4
  assert [source[i] for i in range(4)] == ["good line", "café ok"] * 2
  assert source.skipped == {"invalid_utf8": 2, "empty": 4}
  assert source.first_skipped["invalid_utf8"].endswith("a.txt:2")
  it = make_lm_iterator(source, _vocab(["good line"]), PRETOK, batch_size=2, unroll_steps=4, seed=0,
                        num_epochs=1, shuffle=False, process_index=0, process_count=1)
  list(it)
  assert it.counters["skipped_lines"] == {"invalid_utf8": 2, "empty": 4}
  assert it.counters["sentences"] == 4
  with pytest.raises(FileNotFoundError, match="nothing-here"):
    TextSource(str(tmp_path / "nothing-here*.txt"))


def test_tfds_local_dataset_round_trip(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  texts = ["first sentence .", "second one", "caf\u00e9 third"]

  class TinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}), disable_shuffling=True
      )

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(texts), "test": self._generate_examples(["x"])}

    def _generate_examples(self, rows):
      for i, row in enumerate(rows):
        yield i, {"text": row}

  TinyText(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  source = TfdsSource("tiny_text", split="train", data_dir=str(tmp_path))
  assert len(source) == 3 and [source[i] for i in range(3)] == texts
  assert TfdsSource("tiny_text", split="test", data_dir=str(tmp_path))[0] == "x"
  it = make_lm_iterator(source, _vocab(texts), PRETOK, batch_size=3, unroll_steps=4, seed=0, num_epochs=1,
                        shuffle=False, process_index=0, process_count=1)
  rows = _rows(list(it), _vocab(texts))
  assert rows["fwd_tgt"] == [["first", "sentence", ".", EOS_TOKEN], ["second", "one", EOS_TOKEN],
                             ["café", "third", EOS_TOKEN]]
  with pytest.raises(ValueError, match="not_there"):
    TfdsSource("not_there", split="train", data_dir=str(tmp_path))


# ---------------------------------------------------------------- pipeline


def test_stream_semantics_exact():
  sentences = ["a b c", "d e", "f", "g h i j"]
  vocab = _vocab(sentences)
  it = make_lm_iterator(sentences, vocab, PRETOK, batch_size=2, unroll_steps=3, seed=0, shuffle=False,
                        num_epochs=1, process_index=0, process_count=1)
  first = next(it)
  ids = vocab.encode
  # Row 0 reads sentences 0, 2; row 1 reads 1, 3. Window 1 of row 0: <S> a b -> a b c.
  np.testing.assert_array_equal(first["fwd_targets"], [ids(["a", "b", "c"]), ids(["d", "e", EOS_TOKEN])])
  np.testing.assert_array_equal(first["bwd_targets"], [ids(["c", "b", "a"]), ids(["e", "d", BOS_TOKEN])])
  np.testing.assert_array_equal(first["fwd_chars"][0, 0], token_to_ids(BOS_TOKEN))
  np.testing.assert_array_equal(first["bwd_chars"][0, 0], token_to_ids(EOS_TOKEN))
  np.testing.assert_array_equal(first["bwd_chars"][1, 2], token_to_ids("d"))
  rows = _rows([first, *it], vocab)
  assert rows["fwd_in"][0] == [BOS_TOKEN, "a", "b", "c", BOS_TOKEN, "f"]
  assert rows["fwd_tgt"][0] == ["a", "b", "c", EOS_TOKEN, "f", EOS_TOKEN]
  assert rows["bwd_in"][0] == [EOS_TOKEN, "c", "b", "a", EOS_TOKEN, "f"]
  assert rows["bwd_tgt"][0] == ["c", "b", "a", BOS_TOKEN, "f", BOS_TOKEN]
  assert rows["fwd_tgt"][1] == ["d", "e", EOS_TOKEN, "g", "h", "i", "j", EOS_TOKEN]
  assert rows["bwd_tgt"][1] == ["e", "d", BOS_TOKEN, "j", "i", "h", "g", BOS_TOKEN]


def test_finite_pass_covers_every_sentence_once_with_padding():
  sentences = _corpus(23)
  vocab = _vocab(sentences)
  it = make_lm_iterator(sentences, vocab, PRETOK, batch_size=4, unroll_steps=5, seed=0, shuffle=False,
                        num_epochs=1, process_index=0, process_count=1)
  batches = list(it)
  with pytest.raises(StopIteration):
    next(it)
  weights = np.stack([b["weights"] for b in batches])
  assert weights[-1].min() == 0.0 and weights[0].min() == 1.0  # padding only at the end
  for b in batches:
    pad = b["weights"] == 0
    assert not b["fwd_chars"][pad].any() and not b["bwd_chars"][pad].any()
    assert not b["fwd_targets"][pad].any() and not b["bwd_targets"][pad].any()
  rows = _rows(batches, vocab)
  targets = [t for row in rows["fwd_tgt"] for t in row]
  words = [w for s in sentences for w in s.split()]
  assert sorted(t for t in targets if t != EOS_TOKEN) == sorted(words)
  assert targets.count(EOS_TOKEN) == len(sentences)
  assert it.counters["sentences"] == 23 and it.counters["tokens"] == len(words)
  # Rows are continuous streams: row r is exactly sentences r, r+4, r+8, ...
  for r in range(4):
    expected = [t for s in sentences[r::4] for t in s.split() + [EOS_TOKEN]]
    assert rows["fwd_tgt"][r] == expected


def test_shuffle_deterministic_per_seed_and_epoch():
  sentences = _corpus(40)
  vocab = _vocab(sentences)
  make = lambda seed: make_lm_iterator(sentences, vocab, PRETOK, batch_size=3, unroll_steps=4, seed=seed,
                                       process_index=0, process_count=1)
  a, b, c = _take(make(7), 30), _take(make(7), 30), _take(make(8), 30)
  for x, y in zip(a, b):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  assert any(not np.array_equal(x["fwd_targets"], z["fwd_targets"]) for x, z in zip(a, c))
  # Infinite: 30 batches x 3 rows x 4 steps = 360 steps > 40 sentences x ~5 steps, so epochs wrap.
  assert all(x["weights"].min() == 1.0 for x in a)


def test_process_shards_are_disjoint_and_cover():
  sentences = _corpus(31)
  vocab = _vocab(sentences)
  seen = []
  for p in range(3):
    it = make_lm_iterator(sentences, vocab, PRETOK, batch_size=2, unroll_steps=6, seed=3, num_epochs=1,
                          process_index=p, process_count=3)
    rows = _rows(list(it), vocab)
    seen.append({t.split("w")[0] for row in rows["fwd_tgt"] for t in row if t != EOS_TOKEN})
    assert it.counters["sentences"] in (10, 11)
  assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
  assert set.union(*seen) == {f"s{i}" for i in range(31)}


def test_state_restore_is_bit_exact():
  sentences = _corpus(25)
  vocab = _vocab(sentences)
  make = lambda: make_lm_iterator(sentences, vocab, PRETOK, batch_size=3, unroll_steps=4, seed=5,
                                  process_index=0, process_count=1)
  it = make()
  _take(it, 7)
  encoded = json.dumps(it.get_state())
  assert len(encoded) < 2000  # O(batch_size), stored in every checkpoint
  state = json.loads(encoded)
  expected = _take(it, 40)  # crosses epoch boundaries
  restored = make()
  restored.set_state(state)
  for x, y in zip(expected, _take(restored, 40)):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])
  assert restored.counters == it.counters
  other = make_lm_iterator(sentences, vocab, PRETOK, batch_size=3, unroll_steps=4, seed=6, process_index=0,
                           process_count=1)
  with pytest.raises(ValueError, match="seed"):
    other.set_state(state)


def test_raw_text_dedupe_is_by_content_so_a_resumed_stream_gives_the_same_tables():
  """Raw text numbers its types as it reads them, and a resumed iterator reads in another order: its
  deduped tables go by content (the char rows), so they equal the uninterrupted stream's bit for bit, and
  they index back to the plain batches' chars."""
  sentences = _corpus(40)
  vocab = _vocab(sentences)
  make = lambda **kw: make_lm_iterator(sentences, vocab, PRETOK, batch_size=4, unroll_steps=5, seed=3,
                                       process_index=0, process_count=1, **kw)
  plain, deduped = make(), make(dedupe_shards=2)
  _take(plain, 6)
  _take(deduped, 6)
  resumed = make(dedupe_shards=2)
  resumed.set_state(deduped.get_state())
  for a, b, c in zip(_take(plain, 12), _take(deduped, 12), _take(resumed, 12)):
    for key in b:
      np.testing.assert_array_equal(b[key], c[key], err_msg=key)
    shard_of_row = np.arange(4)[:, None] // 2
    for d in ("fwd", "bwd"):
      np.testing.assert_array_equal(b["token_chars"][shard_of_row, b[f"{d}_index"]], a[f"{d}_chars"])


def test_tokens_the_char_ids_cut_are_counted_by_utf8_bytes():
  """bilm-tf's ids keep 48 UTF-8 bytes: 17 Chinese characters (51 bytes) are cut, 16 are not; the count says
  what the model cannot see (it said 0 for whitespace-split Chinese)."""
  sentences = ["中" * 17 + " " + "中" * 16 + " ok"]
  it = make_lm_iterator(sentences, _vocab(["ok"]), PRETOK, batch_size=1, unroll_steps=8, seed=0, shuffle=False,
                        num_epochs=1, process_index=0, process_count=1, max_token_chars=50)
  next(it)
  assert it.counters["truncated_tokens"] == 1


def test_long_tokens_truncated_and_counted():
  sentences = ["ok " + "x" * 80, "fine"]
  vocab = _vocab(["ok fine " + "x" * 10])
  it = make_lm_iterator(sentences, vocab, PRETOK, batch_size=1, unroll_steps=8, seed=0, shuffle=False,
                        num_epochs=1, process_index=0, process_count=1, max_token_chars=10)
  batch = next(it)
  assert it.counters["truncated_tokens"] == 1
  assert batch["fwd_targets"][0, 1] == vocab.id("x" * 10)
  np.testing.assert_array_equal(batch["fwd_chars"][0, 2], token_to_ids("x" * 10))
