"""A TF bundle's index is checked before it is believed (formats/tf_bundle.py, tfhub.py): each entry's dtype,
rank, offset and size against the data file and the variable the model expects; one line each."""
from __future__ import annotations

import os

import numpy as np
import pytest

import bundle_util
from elmo_jax.formats import tf_bundle
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights
from paths import TFHUB_MODULE


@pytest.fixture(scope="module")
def tensors():
  """The fixture module's variables ({name: array, or a list of bytes for its string tensor})."""
  got = tf_bundle.read_tensors(os.path.join(TFHUB_MODULE, tfhub.VARIABLES))
  return {k: list(v.ravel()) if v.dtype == object else v for k, v in got.items()}


def _module(tmp_path, tensors, overrides=None, **replace):
  folder = tmp_path / "module"
  bundle_util.write(str(folder / tfhub.VARIABLES), {**tensors, **replace}, overrides)
  return str(folder), str(folder / tfhub.VARIABLES) + ".index"


def test_a_rewritten_bundle_loads_as_the_fixture(tmp_path, tensors):
  folder, _ = _module(tmp_path, tensors)
  got, want = tfhub.load(folder, quiet=True), tfhub.load(TFHUB_MODULE, quiet=True)
  assert got.options == want.options and got.mix["scaling"] == want.mix["scaling"]
  assert got.params["char_cnn"]["char_embed"].tobytes() == want.params["char_cnn"]["char_embed"].tobytes()


def test_a_variable_of_the_wrong_dtype_is_refused_with_a_valid_crc32c(tmp_path, tensors):
  """An int32 char_embed and a string aggregation/scaling: their bytes pass crc32c, their dtype does not."""
  folder, index = _module(tmp_path, tensors, **{"bilm/char_embed": tensors["bilm/char_embed"].astype(np.int32)})
  with pytest.raises(weights.WeightFileError) as e:
    tfhub.load(folder, quiet=True)
  assert str(e.value) == f"{index}: variable 'bilm/char_embed' holds int32 values, not floats"
  folder, index = _module(tmp_path, tensors, **{"aggregation/scaling": [b"1.5"]})
  with pytest.raises(weights.WeightFileError) as e:
    tfhub.load(folder, quiet=True)
  assert str(e.value) == f"{index}: variable 'aggregation/scaling' holds object values, not floats"
  folder, index = _module(tmp_path, tensors, **{"aggregation/weights": np.float32([0, np.inf, 0])})
  with pytest.raises(weights.WeightFileError, match="'aggregation/weights' holds non-finite values$"):
    tfhub.load(folder, quiet=True)


@pytest.mark.parametrize("edit,says", [
    ({"offset": -5}, "has offset -5, size 128, shard 0: negative"),
    ({"size": -1}, "size -1, shard 0: negative"),
    ({"size": 1 << 40}, "has 1099511627776 bytes; shape [262, 4] of float32 needs 4192"),
    ({"shape": (262, -4)}, "has shape [262, -4] (rank 2): not a tensor's shape"),
    ({"shape": (2,) * 40}, "(rank 40): not a tensor's shape"),
    ({"dtype": 20}, "has TensorFlow dtype 20, which is not read here"),
    ({"dtype": 3}, "has 4192 bytes; shape [262, 4] of int32 needs 4192"),
])
def test_an_index_entry_is_checked_before_it_is_believed(tmp_path, tensors, edit, says):
  name = "bilm/char_embed" if "offset" not in edit else "aggregation/scaling"
  if "offset" in edit:
    says = says.replace("size 128", "size 4")
  folder, index = _module(tmp_path, tensors, {name: edit})
  if edit == {"dtype": 3}:  # a valid int32 entry over the same bytes: the model's check refuses it
    with pytest.raises(weights.WeightFileError, match="holds int32 values, not floats$"):
      tfhub.load(folder, quiet=True)
    return
  with pytest.raises(tf_bundle.BundleError) as e:
    tfhub.load(folder, quiet=True)
  assert str(e.value).startswith(f"{index}: tensor '{name}' ") and says in str(e.value), str(e.value)
  assert "\n" not in str(e.value)


def test_an_entry_past_the_data_file_and_a_wrong_rank(tmp_path, tensors):
  data_size = sum(v.nbytes if isinstance(v, np.ndarray) else 0 for v in tensors.values())
  folder, index = _module(tmp_path, tensors, {"bilm/char_embed": {"offset": 10 ** 9}})
  with pytest.raises(tf_bundle.BundleError, match=r"tensor 'bilm/char_embed' runs past the end of the file \(bytes "
                     r"1,000,000,000 to 1,000,004,192 of [\d,]+; truncated\?\)$"):
    tfhub.load(folder, quiet=True)
  assert data_size > 0
  flat = tensors["bilm/char_embed"].reshape(-1)
  folder, index = _module(tmp_path, tensors, **{"bilm/char_embed": flat})
  with pytest.raises(weights.WeightFileError) as e:
    tfhub.load(folder, quiet=True)
  assert str(e.value) == (f"{index}: variable 'bilm/char_embed' has shape (1048,), of rank 1; the model's is "
                          "of rank 2")
  w = tensors["bilm/CNN/W_cnn_0"]
  folder, index = _module(tmp_path, tensors, **{"bilm/CNN/W_cnn_0": w.reshape(w.shape[1:])})
  with pytest.raises(weights.WeightFileError, match=r"variable 'bilm/CNN/W_cnn_0' has shape \(1, 4, 2\), of rank 3"):
    tfhub.load(folder, quiet=True)
