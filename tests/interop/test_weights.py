"""hdf5 weight interop: bit-exact round trip of bilm-tf's file, preset shapes, errors naming the culprit."""
from __future__ import annotations

import shutil

import h5py
import jax
import numpy as np
import pytest

from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.formats.weights import WeightFileError
from elmo_jax.model import BiLM, BiLMConfig

from paths import FIXTURE_WEIGHTS


def _datasets(path):
  out = {}
  with h5py.File(path, "r") as f:
    f.visititems(lambda n, o: out.__setitem__(n, (o[...], o.dtype)) if isinstance(o, h5py.Dataset) else None)
  return out


def test_fixture_round_trip_is_bit_exact(fixture_options, tmp_path):
  loaded = weights_lib.load_hdf5(FIXTURE_WEIGHTS, fixture_options)
  assert loaded["softmax"] is None
  out = tmp_path / "rt.hdf5"
  weights_lib.save_hdf5(out, loaded["params"], fixture_options)
  original, written = _datasets(FIXTURE_WEIGHTS), _datasets(out)
  assert set(written) == set(original)
  for name, (value, dtype) in original.items():
    assert written[name][1] == dtype, name
    assert written[name][0].shape == value.shape, name
    assert written[name][0].tobytes() == value.tobytes(), name


def test_softmax_round_trip(fixture_options, tmp_path):
  params = weights_lib.load_hdf5(FIXTURE_WEIGHTS, fixture_options)["params"]
  rng = np.random.default_rng(0)
  softmax = {"W": rng.normal(size=(7, 16)).astype(np.float32), "b": rng.normal(size=(7,)).astype(np.float32)}
  out = tmp_path / "sm.hdf5"
  weights_lib.save_hdf5(out, params, fixture_options, softmax=softmax)
  back = weights_lib.load_hdf5(out, fixture_options)
  np.testing.assert_array_equal(back["softmax"]["W"], softmax["W"])
  np.testing.assert_array_equal(back["softmax"]["b"], softmax["b"])
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(back["params"])):
    np.testing.assert_array_equal(a, b)


# The released elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5 layout (a selection, written out by hand).
ORIGINAL_SHAPES = {
    "char_embed": (261, 16),
    "CNN/W_cnn_0": (1, 1, 16, 32), "CNN/W_cnn_6": (1, 7, 16, 1024), "CNN/b_cnn_6": (1024,),
    "CNN_high_0/W_carry": (2048, 2048), "CNN_high_1/b_transform": (2048,),
    "CNN_proj/W_proj": (2048, 512), "CNN_proj/b_proj": (512,),
    "RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0": (1024, 16384),
    "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/B": (16384,),
    "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0": (4096, 512),
}


@pytest.mark.parametrize("name", ["small", "medium", "original"])
def test_preset_param_shapes_match_hdf5_layout(name):
  options = options_lib.validate(options_lib.preset(name))
  model = BiLM(BiLMConfig.from_options(options))
  shapes = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 1, 50), np.int32))["params"]
  flat = {tuple(k.key for k in path): leaf.shape
          for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]}
  layout = list(weights_lib._layout(options))
  assert set(flat) == {path for _, path, _, _ in layout}
  by_name = {}
  for ds, path, file_shape, param_shape in layout:
    assert flat[path] == param_shape, (ds, flat[path], param_shape)
    assert int(np.prod(file_shape)) == int(np.prod(param_shape))
    by_name[ds] = file_shape
  hidden, proj = options["lstm"]["dim"], options["lstm"]["projection_dim"]
  assert by_name["RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"] == (2 * proj, 4 * hidden)
  assert len([d for d in by_name if d.startswith("CNN_high_")]) == 4 * options["char_cnn"]["n_highway"]
  if name == "original":
    for ds, shape in ORIGINAL_SHAPES.items():
      assert by_name[ds] == shape, ds


def _copy_without(tmp_path, drop=None, replace=None):
  path = tmp_path / "broken.hdf5"
  shutil.copy(FIXTURE_WEIGHTS, path)
  with h5py.File(path, "r+") as f:
    if drop:
      del f[drop]
    if replace:
      del f[replace[0]]
      f.create_dataset(replace[0], data=replace[1])
  return path


def test_missing_dataset_is_named(fixture_options, tmp_path):
  name = "RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"
  with pytest.raises(WeightFileError, match=name):
    weights_lib.load_hdf5(_copy_without(tmp_path, drop=name), fixture_options)


def test_wrong_shape_is_named(fixture_options, tmp_path):
  name = "CNN_high_1/W_carry"
  path = _copy_without(tmp_path, replace=(name, np.zeros((124, 123), np.float32)))
  with pytest.raises(WeightFileError, match=f"{name}.*\\(124, 123\\)"):
    weights_lib.load_hdf5(path, fixture_options)


def test_wrong_options_is_named(fixture_options):
  options = options_lib.validate({**fixture_options, "lstm": {**fixture_options["lstm"], "dim": 32}})
  with pytest.raises(WeightFileError, match="RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0.*\\(32, 128\\)"):
    weights_lib.load_hdf5(FIXTURE_WEIGHTS, options)


def test_garbage_and_missing_file_are_named(fixture_options, tmp_path):
  garbage = tmp_path / "garbage.hdf5"
  garbage.write_bytes(b"this is not an hdf5 file" * 10)
  with pytest.raises(WeightFileError, match="garbage.hdf5"):
    weights_lib.load_hdf5(garbage, fixture_options)
  with pytest.raises(WeightFileError, match="nope.hdf5"):
    weights_lib.load_hdf5(tmp_path / "nope.hdf5", fixture_options)
