"""Character ids with bilm-tf's semantics (UnicodeCharsVocabulary + Batcher), all ids shifted by +1."""
from __future__ import annotations

import numpy as np
import pytest

from elmo_jax.data import chars

# Shifted values: bos 257, eos 258, bow 259, eow 260, pad 261.
BOS, EOS, BOW, EOW, PAD = 257, 258, 259, 260, 261


def test_ascii_token():
  ids = chars.token_to_ids("bank")
  assert ids.shape == (50,) and ids.dtype == np.int32
  expected = np.full(50, PAD)
  expected[:6] = [BOW, ord("b") + 1, ord("a") + 1, ord("n") + 1, ord("k") + 1, EOW]
  np.testing.assert_array_equal(ids, expected)


def test_multibyte_token_bytes():
  ids = chars.token_to_ids("é")  # UTF-8: c3 a9
  np.testing.assert_array_equal(ids[:4], [BOW, 0xC3 + 1, 0xA9 + 1, EOW])
  assert np.all(ids[4:] == PAD)


def test_long_token_cut_to_48_bytes_splitting_a_character():
  token = "é" * 30  # 60 bytes; the cut at 48 bytes keeps 24 whole characters
  ids = chars.token_to_ids(token)
  assert ids[0] == BOW and ids[49] == EOW
  np.testing.assert_array_equal(ids[1:49], np.frombuffer(token.encode("utf-8")[:48], np.uint8) + 1)
  # An odd prefix: 'a' + 'é' * 30 -> the 48th byte is the first half of an 'é' (split character).
  ids = chars.token_to_ids("a" + "é" * 30)
  raw = ("a" + "é" * 30).encode("utf-8")[:48]
  assert raw[-1] == 0xC3
  np.testing.assert_array_equal(ids[1:49], np.frombuffer(raw, np.uint8) + 1)
  assert ids[48] == 0xC3 + 1 and ids[49] == EOW


def test_special_tokens():
  for token, mid in ((chars.BOS_TOKEN, BOS), (chars.EOS_TOKEN, EOS)):
    ids = chars.token_to_ids(token)
    np.testing.assert_array_equal(ids[:3], [BOW, mid, EOW])
    assert np.all(ids[3:] == PAD) and ids.shape == (50,)


def test_batch_to_ids_shape_and_padding():
  batch = [["a", "bb", "ccc"], ["d"], []]
  ids = chars.batch_to_ids(batch)
  assert ids.shape == (3, 3, 50) and ids.dtype == np.int32
  np.testing.assert_array_equal(ids[0, 1], chars.token_to_ids("bb"))
  np.testing.assert_array_equal(ids[1, 0], chars.token_to_ids("d"))
  assert np.all(ids[1, 1:] == 0) and np.all(ids[2] == 0)
  assert np.all(ids[0] > 0)
  padded = chars.batch_to_ids(batch, pad_to=5)
  assert padded.shape == (3, 5, 50) and np.all(padded[:, 3:] == 0)
  np.testing.assert_array_equal(padded[:, :3], ids)
  with pytest.raises(ValueError):
    chars.batch_to_ids(batch, pad_to=2)
  assert chars.batch_to_ids([]).shape == (0, 0, 50)


def test_batch_to_ids_add_bos_eos():
  ids = chars.batch_to_ids([["a", "b"], ["c"]], add_bos_eos=True)
  assert ids.shape == (2, 4, 50)
  np.testing.assert_array_equal(ids[0, 0], chars.token_to_ids("<S>"))
  np.testing.assert_array_equal(ids[0, 3], chars.token_to_ids("</S>"))
  np.testing.assert_array_equal(ids[1, 2], chars.token_to_ids("</S>"))
  np.testing.assert_array_equal(ids[1, 1], chars.token_to_ids("c"))
  assert np.all(ids[1, 3] == 0)


def test_cache_returns_same_ids():
  cache = chars.CharIdCache(max_size=1)
  np.testing.assert_array_equal(cache("xy"), chars.token_to_ids("xy"))
  np.testing.assert_array_equal(cache("zz"), chars.token_to_ids("zz"))  # beyond max_size: still correct


_MIXED = ["the", "", "<S>", "</S>", "<UNK>", "naïve", "日本語テキスト", "a" * 47, "b" * 48, "c" * 49, "é" * 30,
          "x\ud800y", "\U0001F600", ".", "<S>x"]


@pytest.mark.parametrize("max_chars", [50, 12])
def test_tokens_to_ids_are_token_to_ids_byte_for_byte(max_chars):
  want = np.stack([chars.token_to_ids(t, max_chars) for t in _MIXED])
  np.testing.assert_array_equal(chars.tokens_to_ids(_MIXED, max_chars), want)
  assert chars.tokens_to_ids([], max_chars).shape == (0, max_chars)
  cache = chars.CharIdCache(max_chars, max_size=3)  # full after three: the rest still right, not kept
  np.testing.assert_array_equal(cache.many(_MIXED + _MIXED[:4]), np.concatenate([want, want[:4]]))
  assert len(cache._cache) == 3  # pylint: disable=protected-access


def test_batch_to_ids_is_each_tokens_ids_in_place():
  batch = [_MIXED[:5], [], _MIXED[5:], ["the", "the"]]
  got = chars.batch_to_ids(batch, add_bos_eos=True, pad_to=14)
  want = np.zeros((4, 14, 50), np.int32)
  for b, sentence in enumerate(batch):
    for t, token in enumerate(["<S>", *sentence, "</S>"]):
      want[b, t] = chars.token_to_ids(token)
  np.testing.assert_array_equal(got, want)
