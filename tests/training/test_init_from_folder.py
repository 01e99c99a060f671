"""`config.init_from` takes elmo_jax's safetensors folder as it takes the folder's source (through the one
resolver, `resolve.resolve_model`, and the one load): the same biLM bits, the softmax where the vocabulary is the
run's, a shape that differs named in one line."""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import fixture_models
from elmo_jax.data import Vocab
from elmo_jax.sources import loaded
from elmo_jax.sources import resolve
from elmo_jax.training import init_from


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[str, str]:
  root = tmp_path_factory.mktemp("init_from")
  pair = fixture_models.write_run_like(root / "pair")
  return pair, fixture_models.write_safetensors_twin(pair, root / "safetensors")


def test_a_safetensors_folder_is_a_source_like_its_pair(folders):
  pair, folder = folders
  options = loaded.load_model(resolve.resolve_model(pair)).options
  vocab_sha256 = Vocab.load(os.path.join(pair, "vocab.txt")).sha256()
  init_from.check(folder, options)
  assert os.path.join(folder, "model.safetensors") in init_from.source_files(folder)
  assert init_from.source_options(folder) == (options, None)
  want = init_from.load(pair, options, vocab_sha256)
  got = init_from.load(folder, options, vocab_sha256)
  same = jax.tree_util.tree_map(np.array_equal, got[0], want[0])
  assert all(jax.tree_util.tree_leaves(same)) and got[1] is not None
  assert np.array_equal(got[1]["W"], want[1]["W"]) and "and its softmax" in got[2]
  bilm, softmax, description = init_from.load(folder, options, "another vocabulary")
  assert softmax is None and description.endswith(f"another vocabulary: a new one ({init_from.NEW_SOFTMAX})")
  other = {**options, "lstm": {**options["lstm"], "dim": options["lstm"]["dim"] * 2}}
  with pytest.raises(init_from.InitFromError, match=r"^config.init_from=.*safetensors: model shape differs"):
    init_from.check(folder, other)
