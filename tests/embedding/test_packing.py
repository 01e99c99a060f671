"""Packed rows (`host_batch.pack`, `Steps.layers`, `BiLM.packed`): sentences laid end to end in a batch's rows,
both LSTM directions reset at each sentence, give each sentence the layers of a row of its own within 1e-6
(XLA:CPU rounds a row by its position), whatever the mix of lengths, on every device count; the packer lays every
sentence once within its limits and leaves little padding on real sentences; no call compiles after load."""
from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elmo_jax.embedding import host_batch
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.runtime.compile_count import CompileCounter

from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT
from tiny import tiny_options

TOLERANCE = 1e-6  # a packed row's sentence against a row of its own: XLA:CPU rounds a row by where it sits
_WORDS = "the bank of a river flooded she sat on it money is in plant trees near naïve 日本語 .".split()


def _rounded(n: int, most: int = 64) -> int:
  return min(most, 1 << max(0, n - 1).bit_length())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 700), max_size=64), st.sampled_from([34, 130, 514]))
def test_pack_lays_every_sentence_once_within_its_slots(lengths, max_slots):
  rows = host_batch.pack(lengths, max_slots, _rounded)
  laid = [i for row in rows for i in row]
  assert sorted(laid) == [i for i, n in enumerate(lengths) if n]  # an empty sentence takes no slot
  assert all(rows) and len(rows) <= len(lengths)
  longest = max(lengths, default=0) + 2
  for row in rows:
    assert sum(lengths[i] + 2 for i in row) <= max(max_slots, longest)


def test_pack_leaves_little_padding_on_real_sentences():
  """Groups of 16 consecutive lines of the shipped corpus (median ~25 tokens, a long tail): the row-steps a batch
  runs (rows rounded to a warm count, times its fullest row) over those its sentences need."""
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "train.txt.gz"), "rt", encoding="utf-8") as f:
    lengths = [len(line.split()) for _, line in zip(range(1600), f) if line.split()]
  run = needed = unpacked = 0
  for start in range(0, len(lengths), 16):
    group = lengths[start:start + 16]
    unpacked += _rounded(len(group)) * (max(group) + 2)
    rows = host_batch.pack(group, 514, _rounded)  # a warm Embedder's rows: 512 + 2 slots
    fills = [sum(group[i] + 2 for i in row) for row in rows]
    run, needed = run + _rounded(len(rows)) * max(fills), needed + sum(fills)
  assert 1 - needed / run <= 0.15, 1 - needed / run
  assert 1 - needed / unpacked >= 0.4  # what one sentence a row would waste on the same groups


def test_like_lengths_stay_one_a_row_and_unlike_ones_share():
  """A length-sorted batch of like lengths (the embed command's) runs as before: halving its rows would double
  its steps. Short sentences beside a long one fill its steps in one row."""
  assert host_batch.pack([20] * 64, 514, _rounded) == [[i] for i in range(64)]
  assert host_batch.pack([3] * 64, 514, _rounded) == [[i] for i in range(64)]
  assert host_batch.pack([40, 3, 3, 0, 3, 3, 3], 514, _rounded) == [[0], [1, 2, 4, 5, 6]]


def _sentence(n: int, k: int) -> list[str]:
  return [_WORDS[(k + 5 * i) % len(_WORDS)] + "s" * ((k * i) % 3) for i in range(n)]


@pytest.fixture(scope="module")
def tiny_pair():
  """A warm Embedder of 4 rows a batch (it packs) and the compile-as-you-go one of the same weights, whose
  `embed_batch([s])` is a row of its own."""
  params = Embedder.random(tiny_options(), seed=3, warm=False).params
  return Embedder(tiny_options(), params, batch_size=4, warm=True), Embedder(tiny_options(), params, warm=False)


def _alone(ref: Embedder, sentence: list[str]) -> np.ndarray:
  return ref.embed_batch([sentence])[0][:, :len(sentence)]


# Bucket edges (a sentence takes n + 2 slots in a row of bucket + 2), the longest warm bucket, past it (alone, in
# stretches), empty sentences
_EDGE_MIXES = [[30, 31, 32, 33, 0, 1], [126, 127, 128, 129, 2], [510, 511, 512, 513, 1, 1], [0], [0, 0, 3],
               [1] * 40, [64, 63, 62, 1, 1, 1, 1, 1, 1, 1, 1, 1]]


@pytest.mark.parametrize("mix", range(len(_EDGE_MIXES)))
def test_packed_sentences_equal_rows_of_their_own_at_the_bucket_edges(tiny_pair, mix):
  packed, ref = tiny_pair
  sentences = [_sentence(n, k + 7 * mix) for k, n in enumerate(_EDGE_MIXES[mix])]
  with CompileCounter() as compiles:
    got = packed.embed_sentences(sentences)
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()
  for s, g in zip(sentences, got):
    assert g.shape == (packed.n_layers, len(s), packed.output_dim) and g.base is None
    if s:
      np.testing.assert_allclose(g, _alone(ref, s), rtol=0, atol=TOLERANCE)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(0, 140), min_size=1, max_size=24), st.integers(0, 1000))
def test_packed_sentences_equal_rows_of_their_own_for_random_mixes(tiny_pair, lengths, seed):
  packed, ref = tiny_pair
  sentences = [_sentence(n, seed + k) for k, n in enumerate(lengths)]
  for s, g in zip(sentences, packed.embed_sentences(sentences)):
    assert g.shape[1] == len(s)
    if s:
      np.testing.assert_allclose(g, _alone(ref, s), rtol=0, atol=TOLERANCE)


def test_packing_the_bilm_tf_fixture_keeps_each_sentence(fixture_options):
  """bilm-tf's own weights (clip-heavy, 2 layers, skip connection): 12 sentences packed into a 64-row shape."""
  packed = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS)
  ref = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS, warm=False)
  sentences = [_sentence(n, n) for n in (3, 17, 1, 40, 9, 9, 25, 2, 60, 11, 5, 33)]
  before = list(packed.row_steps)
  got = packed.embed_sentences(sentences)
  for s, g in zip(sentences, got):
    np.testing.assert_allclose(g, _alone(ref, s), rtol=0, atol=TOLERANCE)
  run, needed = packed.row_steps[0] - before[0], packed.row_steps[1] - before[1]
  assert needed == sum(len(s) + 2 for s in sentences) and run < 12 * 62  # fewer steps than a row each
