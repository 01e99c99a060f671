"""EFML-style lexicons (data/lexicon.py): built as EFML's trainer builds them, read and written as its dics, and
the data path's ids through them (raw text and prepared corpora give the same tables; unknowns counted)."""
from __future__ import annotations

import numpy as np
import pytest

from elmo_jax.data import Tokenizer, Vocab, chars
from elmo_jax.data import lexicon as lexicon_lib
from elmo_jax.data.pipeline import TextTypes

SENTENCES = [["bir", "iki", "üç"], ["iki", "dört", "iki"], ["çok", "uzunbirkelimeburada"]]


def test_build_as_efml_trainer_does():
  lex = lexicon_lib.build(SENTENCES, max_chars=8, min_count=2)
  assert list(lex.word2id) == ["<oov>", "<bos>", "<eos>", "<pad>", "iki"]  # count >= 2 only
  assert list(lex.word2id.values()) == list(range(5))
  chars_in_order = list(lex.char2id)
  assert chars_in_order[:5] == list("<bos>")  # EFML walks <bos>'s characters first
  assert chars_in_order[-6:] == ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"]
  assert "ü" in lex.char2id and "r" in lex.char2id
  all_words = lexicon_lib.build(SENTENCES, max_chars=8, min_count=1, max_size=6)
  assert list(all_words.word2id) == ["<oov>", "<bos>", "<eos>", "<pad>", "iki", "bir"]  # ties: first seen
  every = lexicon_lib.build(SENTENCES, max_chars=8, min_count=1)
  assert "uzunbi" in every.word2id and "a" not in every.char2id  # cut to max_chars - 2 code points first
  values = lex.option_values()
  assert values["char_vocab_size"] == len(lex.char2id) and values["n_words"] == 5
  assert values["special_ids"][0][1] == lex.char2id["<eow>"] + 1  # EFML's swapped begin-of-word id


def test_save_and_read_round_trip(tmp_path):
  lex = lexicon_lib.build(SENTENCES + [["a\u3000b"]], max_chars=10)
  lex.save(str(tmp_path))
  back = lexicon_lib.read(str(tmp_path), 10)
  assert back == lex
  (tmp_path / "char.dic").write_text("x\t0\n", encoding="utf-8")
  with pytest.raises(lexicon_lib.LexiconError, match=r"char.dic has no <oov>$"):
    lexicon_lib.read(str(tmp_path), 10)
  with pytest.raises(lexicon_lib.LexiconError, match=r"nothing/char.dic: not found"):
    lexicon_lib.read(str(tmp_path / "nothing"), 10)


def test_text_types_give_lexicon_ids_and_count_unknowns():
  lex = lexicon_lib.build(SENTENCES, max_chars=8, min_count=2)
  ids = lexicon_lib.TokenIds(lex)
  vocab = Vocab.build([s for s in SENTENCES], max_size=100, min_count=1)
  types = TextTypes(["iki bir", "iki xyz"], Tokenizer(pretokenized=True), vocab, 50, 8, token_ids=ids)
  assert types.type_ids(0).tolist() == [2, 3] and types.type_ids(1).tolist() == [2, 4]
  table, targets, truncated = types.tables()
  assert table.shape == (5, 9)  # the word id, then max_chars char ids
  reference = chars.LexiconIds(lex.char2id, lex.word2id, 8)
  np.testing.assert_array_equal(table[0], reference.special[0])
  np.testing.assert_array_equal(table[1], reference.special[1])
  for row, token in zip(table[2:], ["iki", "bir", "xyz"]):
    np.testing.assert_array_equal(row, reference(token))
  assert table[3][0] == lex.word2id["<oov>"] + 1  # "bir" is seen once: not in word.dic
  assert (ids.unknown_words, ids.unknown_char_types) == (2, 1)  # bir, xyz; x, y, z are not in char.dic
  assert targets.tolist()[2:] == [vocab.id("iki"), vocab.id("bir"), vocab.id("xyz")] and not truncated.any()
