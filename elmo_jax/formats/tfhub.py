"""TF-Hub `google/elmo/3`-layout modules: the checkpoint's variables as `BiLM` params, and the module's outputs.

    module = tfhub.load("elmo_3/")        # MODULE_DIR/variables/variables.{index,data-*}; no TensorFlow
    module.options, module.params         # options.json content (inferred), BiLM params as weights.load_hdf5
    tfhub.outputs(layers, module.mix)     # {"word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default"}

Only the checkpoint is read (`tf_bundle`), never the module's graph (`saved_model.pb`, `tfhub_module.pb`).
The variables are bilm-tf's inference graph's (`bilm/...`), under the names that bilm-tf's
`_pretrained_initializer` maps to its hdf5 datasets (`weights.py`'s names): `bilm/char_embed` [262, dim] (the
padding row first), `bilm/CNN/{W,b}_cnn_i`, `bilm/CNN_high_i/*`, `bilm/CNN_proj/*`,
`bilm/RNN_{0,1}/RNN/MultiRNNCell/Cell{k}/rnn/lstm_cell/{kernel,bias,projection/kernel}` (= `W_0`, `B`,
`W_P_0`; RNN_0 forward), and the mix `aggregation/weights` [n_layers + 1] and `aggregation/scaling` [] (the
names TF-Hub's loader logs for elmo/2, tensorflow/hub#88). The shapes give the sizes; what the checkpoint
does not hold is elmo/3's (`ELMO3`), said in one line.
"""
from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Any

import numpy as np

from elmo_jax.formats import options as options_lib
from elmo_jax.formats import tf_bundle
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import log

VARIABLES = os.path.join("variables", "variables")  # the bundle's prefix inside a module folder
# What elmo/3 (= the paper's 2x4096_512_2048cnn_2xhighway) uses and its checkpoint does not hold.
ELMO3 = {"cell_clip": 3, "proj_clip": 3, "use_skip_connections": True, "activation": "relu",
         "max_characters_per_token": 50}
ASSUMED = ("a TF-Hub module's checkpoint holds no options: using elmo/3's cell_clip=3, proj_clip=3, relu, "
           "skip connections and 50 characters per token")
OUTPUTS = ("word_emb", "lstm_outputs1", "lstm_outputs2", "elmo", "default")
_LSTM = {"W_0": "kernel", "B": "bias", "W_P_0": "projection/kernel"}


@dataclasses.dataclass(frozen=True)
class Module:
  """A loaded module: options (as options.json), `BiLM` params, its mix, and the files it was read from."""
  options: dict[str, Any]
  params: dict[str, Any]
  mix: dict[str, np.ndarray]  # {"weights": [n_layers + 1] float32, "scaling": [] float32}
  files: tuple[str, ...]


def is_module(path: str | os.PathLike) -> bool:
  """A folder holding `variables/variables.index` (what a TF1 Hub module or a SavedModel has)."""
  return os.path.isfile(os.path.join(os.fspath(path), VARIABLES + ".index"))


def tf_name(dataset: str) -> str:
  """The module's variable of a bilm-tf hdf5 dataset (`weights.py`'s names): bilm-tf's own map, reversed."""
  m = re.fullmatch(r"(RNN_\d+/RNN/MultiRNNCell/Cell\d+)/LSTMCell/(W_0|B|W_P_0)", dataset)
  if m:
    return f"bilm/{m.group(1)}/rnn/lstm_cell/{_LSTM[m.group(2)]}"
  return f"bilm/{dataset}"


def _count(tensors: dict[str, np.ndarray], pattern: str) -> int:
  """How many consecutive i from 0 have a variable starting with `pattern.format(i)`."""
  n = 0
  while any(name.startswith(pattern.format(n)) for name in tensors):
    n += 1
  return n


def _options(tensors: dict[str, np.ndarray], where: str) -> dict[str, Any]:
  """options.json content from the variables' shapes, elmo/3's values for the rest."""
  def shape(name: str, rank: int) -> tuple[int, ...]:
    """The variable's shape, of the rank the model gives it (checked before a size is read from it)."""
    if name not in tensors:
      raise weights_lib.WeightFileError(f"{where}: variable '{name}' is missing")
    got = tensors[name].shape
    if len(got) != rank:
      raise weights_lib.WeightFileError(f"{where}: variable '{name}' has shape {got}, of rank {len(got)}; the "
                                        f"model's is of rank {rank}")
    return got
  dim = shape("bilm/char_embed", 2)[-1]
  filters = [[shape(f"bilm/CNN/W_cnn_{i}", 4)[1], shape(f"bilm/CNN/W_cnn_{i}", 4)[-1]]
             for i in range(_count(tensors, "bilm/CNN/W_cnn_{}"))]
  n_filters = sum(n for _, n in filters)
  projection = shape("bilm/CNN_proj/W_proj", 2)[1] if "bilm/CNN_proj/W_proj" in tensors else n_filters
  cell = "bilm/RNN_0/RNN/MultiRNNCell/Cell{}/"
  n_layers = _count(tensors, cell)
  if not filters:
    shape("bilm/CNN/W_cnn_0", 4)  # names the first one missing
  hidden = shape(cell.format(0) + "rnn/lstm_cell/bias", 1)[0] // 4
  return options_lib.validate({
      "char_cnn": {"activation": ELMO3["activation"], "embedding": {"dim": dim}, "filters": filters,
                   "max_characters_per_token": ELMO3["max_characters_per_token"], "n_characters": 262,
                   "n_highway": _count(tensors, "bilm/CNN_high_{}/")},
      "lstm": {"cell_clip": ELMO3["cell_clip"], "dim": hidden, "n_layers": n_layers,
               "proj_clip": ELMO3["proj_clip"], "projection_dim": projection,
               "use_skip_connections": ELMO3["use_skip_connections"]},
  }, where)


def load(module_dir: str | os.PathLike, *, quiet: bool = False) -> Module:
  """Reads a module folder's checkpoint (every tensor's crc32c checked). Raises tf_bundle.BundleError (the
  bundle) or weights.WeightFileError (a variable missing or of the wrong shape), one line naming it."""
  prefix = os.path.join(os.fspath(module_dir), VARIABLES)
  where = prefix + ".index"
  tensors = tf_bundle.read_tensors(prefix)
  options = _options(tensors, where)
  params = weights_lib.params_from(lambda name: tensors.get(tf_name(name)), options, where,
                                   label=lambda name: f"variable '{tf_name(name)}'")
  mix = {}
  for key, want in (("weights", (options["lstm"]["n_layers"] + 1,)), ("scaling", ())):
    name = f"aggregation/{key}"
    if name not in tensors:
      raise weights_lib.WeightFileError(f"{where}: variable '{name}' is missing (the module's mix, shape {want})")
    value = np.asarray(tensors[name])
    value = value.reshape(want) if value.size == int(np.prod(want)) else value  # [1] for [] is TF-Hub's too
    mix[key] = weights_lib.checked(value, want, f"{where}: variable '{name}'", "expected")
  if not quiet:
    log.info(f"{module_dir}: {ASSUMED}", stream=sys.stderr)
  n_shards, _ = tf_bundle.read_index(prefix)
  data = tuple(tf_bundle.data_file(prefix, i, n_shards) for i in range(n_shards))
  return Module(options, params, mix, (where, *data))


def elmo(layers: np.ndarray, mix: dict[str, np.ndarray]) -> np.ndarray:
  """The module's `elmo`: `[n_layers + 1, ..., 2P]` -> `[..., 2P]`, bilm-tf's `weight_layers` as the module
  computes it: softmax(weights + 1 / n) (the same softmax), the weighted layers summed in order, times scaling."""
  w = mix["weights"].astype(np.float32) + np.float32(1.0 / layers.shape[0])
  w = np.exp(w - w.max())
  w = w / w.sum()
  total = w[0] * layers[0]
  for k in range(1, layers.shape[0]):
    total = total + w[k] * layers[k]
  return mix["scaling"].astype(np.float32) * total


def output(layers: np.ndarray, name: str, mix: dict[str, np.ndarray] | None) -> np.ndarray:
  """One of the module's outputs of one sentence's layers `[n_layers + 1, n_tokens, 2P]` (the Embedder's):
  `word_emb` [n_tokens, P] (the char CNN's, which layer 0 holds twice), `lstm_outputs1/2` [n_tokens, 2P],
  `elmo` [n_tokens, 2P] (the mix), `default` [2P] (`elmo` mean-pooled over the tokens; zeros for none)."""
  if name not in OUTPUTS:
    raise ValueError(f"a TF-Hub module's outputs are {', '.join(OUTPUTS)}; got {name!r}")
  if name == "word_emb":
    return layers[0, :, :layers.shape[-1] // 2]
  if name.startswith("lstm_outputs"):
    return layers[int(name[-1])]
  if mix is None:
    raise ValueError(f"'{name}' is the mix of a TF-Hub module; this model has none (load a module folder)")
  mixed = elmo(layers, mix)
  if name == "elmo":
    return mixed
  if not mixed.shape[0]:
    return np.zeros(mixed.shape[1:], np.float32)
  return mixed.mean(axis=0, dtype=np.float64).astype(np.float32)


def outputs(layers: np.ndarray, mix: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
  """Every output of `output` (`elmo` and `default` only with a mix)."""
  names = OUTPUTS if mix is not None else OUTPUTS[:3]
  return {name: output(layers, name, mix) for name in names}
