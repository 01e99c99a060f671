"""Original ELMo weight files (bilm-tf `dump_weights` / AllenNLP hdf5) <-> Flax params of `BiLM`.

Dataset names are bilm-tf's: `char_embed`, `CNN/W_cnn_i`, `CNN/b_cnn_i`, `CNN_high_i/{W,b}_{carry,transform}`,
`CNN_proj/{W,b}_proj`, `RNN_{0,1}/RNN/MultiRNNCell/Cell{k}/LSTMCell/{W_0,B,W_P_0}` (RNN_0 = forward).
We also write `softmax/W` [vocab, P] and `softmax/b` [vocab] when a trained softmax exists; AllenNLP and
bilm-tf ignore datasets they do not read, so the file stays loadable there.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterator

import h5py
import numpy as np

from elmo_jax.formats import options as options_lib
from elmo_jax.runtime import files

_LSTM = "RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell/{name}"


class WeightFileError(ValueError):
  """A weight file that does not match its options; the message names the file and dataset."""


def _layout(options: dict[str, Any]) -> Iterator[tuple[str, tuple[str, ...], tuple[int, ...], tuple[int, ...]]]:
  """Yields (hdf5 dataset, param path, hdf5 shape, param shape) for every tensor of the biLM."""
  cnn, lstm = options["char_cnn"], options["lstm"]
  dim = cnn["embedding"]["dim"]
  yield "char_embed", ("char_cnn", "char_embed"), (261, dim), (261, dim)
  for i, (width, num) in enumerate(cnn["filters"]):
    yield f"CNN/W_cnn_{i}", ("char_cnn", f"W_cnn_{i}"), (1, width, dim, num), (width, dim, num)
    yield f"CNN/b_cnn_{i}", ("char_cnn", f"b_cnn_{i}"), (num,), (num,)
  nf = options_lib.n_filters(options)
  for i in range(cnn.get("n_highway") or 0):
    for name in ("W_carry", "W_transform"):
      yield f"CNN_high_{i}/{name}", ("char_cnn", f"CNN_high_{i}", name), (nf, nf), (nf, nf)
    for name in ("b_carry", "b_transform"):
      yield f"CNN_high_{i}/{name}", ("char_cnn", f"CNN_high_{i}", name), (nf,), (nf,)
  proj, hidden = lstm["projection_dim"], lstm["dim"]
  if proj != nf:
    yield "CNN_proj/W_proj", ("char_cnn", "CNN_proj", "W_proj"), (nf, proj), (nf, proj)
    yield "CNN_proj/b_proj", ("char_cnn", "CNN_proj", "b_proj"), (proj,), (proj,)
  for d, direction in enumerate(("forward", "backward")):
    for k in range(lstm["n_layers"]):
      layer = ("lstm", f"{direction}_layer_{k}")
      shapes = {"W_0": (2 * proj, 4 * hidden), "B": (4 * hidden,), "W_P_0": (hidden, proj)}
      for name, shape in shapes.items():
        yield _LSTM.format(d=d, k=k, name=name), layer + (name,), shape, shape


def _set(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]) -> np.ndarray:
  for key in path:
    tree = tree[key]
  return np.asarray(tree)


def params_from(lookup: Callable[[str], np.ndarray | None], options: dict[str, Any], source: str,
                label: Callable[[str], str] = lambda name: f"dataset '{name}'") -> dict[str, Any]:
  """`BiLM` params (float32 numpy) from `lookup(hdf5 dataset name)` (None: not there), checked against the
  options: every tensor there, of its shape, finite. `label` names a tensor in the one-line errors as the
  source calls it (a TF-Hub module: its variable name)."""
  params: dict[str, Any] = {}
  for name, path, file_shape, param_shape in _layout(options):
    value = lookup(name)
    if value is None:
      raise WeightFileError(f"{source}: {label(name)} is missing (options expect shape {file_shape})")
    value = np.asarray(value)
    if name == "char_embed" and value.shape[:1] == (262,):
      value = value[1:]  # some converters (and bilm-tf's inference graph) also store the padding id's zero row
    _set(params, path, checked(value, file_shape, f"{source}: {label(name)}").reshape(param_shape))
  return params


def checked(value: Any, shape: tuple[int, ...], what: str, expect: str = "options expect") -> np.ndarray:
  """`value` as float32 numpy if it holds floats (not ints, bools or strings) of `shape`, every one finite
  (a float64 beyond float32's range is not); else WeightFileError `what ...`, one line. What every loaded
  parameter passes (hdf5, TF-Hub, EFML)."""
  value = np.asarray(value)
  if value.dtype.kind != "f":
    raise WeightFileError(f"{what} holds {value.dtype.name} values, not floats")
  if value.shape != tuple(shape):
    raise WeightFileError(f"{what} has shape {value.shape}, {expect} {tuple(shape)}")
  with np.errstate(over="ignore"):  # beyond float32's range: inf, refused below
    value = value.astype(np.float32, copy=False)
  if not np.all(np.isfinite(value)):
    raise WeightFileError(f"{what} holds non-finite values")
  return value


def _open(weight_file: str | os.PathLike) -> h5py.File:
  """The weight file opened read-only; WeightFileError for a missing file, another kind of file (options
  and weight files swapped) or an unreadable HDF5 file."""
  if not os.path.exists(weight_file):
    raise WeightFileError(f"{weight_file}: weight file not found")
  kind = files.looks_like(weight_file)
  if kind != "an HDF5 file":
    swapped = " (options and weight files swapped?)" if kind == "a JSON file" else ""
    raise WeightFileError(f"{weight_file}: is {kind}, not an HDF5 weight file{swapped}")
  try:
    return h5py.File(weight_file, "r")
  except OSError as e:
    raise WeightFileError(f"{weight_file}: not a readable HDF5 file ({e})") from None


def _dataset(f: h5py.File, weight_file, name: str, file_shape: tuple[int, ...]) -> h5py.Dataset:
  """The dataset `name`, present and of `file_shape` by its metadata (nothing read); `char_embed` may also
  hold the padding id's zero row (262 rows, as some converters store it)."""
  if name not in f or not isinstance(f[name], h5py.Dataset):
    raise WeightFileError(f"{weight_file}: dataset '{name}' is missing (options expect shape {file_shape})")
  shape = f[name].shape
  if name == "char_embed" and shape[:1] == (262,):
    shape = (261, *shape[1:])
  if shape != file_shape:
    raise WeightFileError(f"{weight_file}: dataset '{name}' has shape {shape}, options expect {file_shape}")
  return f[name]


def has_softmax(weight_file: str | os.PathLike) -> bool:
  """Whether the weight file holds the LM's softmax (`softmax/W`, `softmax/b`), read off its index alone;
  WeightFileError (one line) as `load_hdf5` for a file that is none."""
  with _open(weight_file) as f:
    return "softmax/W" in f and "softmax/b" in f


def check_hdf5(weight_file: str | os.PathLike, options: dict[str, Any]) -> None:
  """What `load_hdf5` refuses that a file's metadata shows (no weight is read): every dataset of `options`
  present, of its shape. For checks before a run writes anything (the trainer's preflight)."""
  with _open(weight_file) as f:
    for name, _, file_shape, _ in _layout(options):
      _dataset(f, weight_file, name, file_shape)


def load_hdf5(weight_file: str | os.PathLike, options: dict[str, Any]) -> dict[str, Any]:
  """Reads an original ELMo hdf5 into `BiLM` params (float32 numpy). Also returns `softmax` if stored.

  Returns {"params": bilm params, "softmax": {"W": [V, P], "b": [V]} or None}.
  """
  with _open(weight_file) as f:
    def lookup(name: str) -> np.ndarray | None:
      if name not in f or not isinstance(f[name], h5py.Dataset):
        return None
      try:
        return np.asarray(f[name][...])
      except (OSError, TypeError, ValueError) as e:
        raise WeightFileError(f"{weight_file}: dataset '{name}' cannot be read ({e})") from None

    params = params_from(lookup, options, str(weight_file))
    softmax = None
    if "softmax/W" in f and "softmax/b" in f:
      softmax = {"W": np.asarray(f["softmax/W"][...], np.float32), "b": np.asarray(f["softmax/b"][...], np.float32)}
      if softmax["W"].shape != (softmax["b"].shape[0], options["lstm"]["projection_dim"]):
        raise WeightFileError(f"{weight_file}: dataset 'softmax/W' has shape {softmax['W'].shape}, "
                              f"expected ({softmax['b'].shape[0]}, {options['lstm']['projection_dim']})")
  return {"params": params, "softmax": softmax}


def save_hdf5(weight_file: str | os.PathLike, params: dict[str, Any], options: dict[str, Any],
              softmax: dict[str, Any] | None = None) -> None:
  """Writes `BiLM` params (and optionally the softmax) in the original layout, atomically."""
  with files.atomic_path(weight_file) as tmp, h5py.File(tmp, "w") as f:
    for name, path, file_shape, _ in _layout(options):
      f.create_dataset(name, data=_get(params, path).astype(np.float32).reshape(file_shape))
    if softmax is not None:
      f.create_dataset("softmax/W", data=np.asarray(softmax["W"], np.float32))
      f.create_dataset("softmax/b", data=np.asarray(softmax["b"], np.float32))
