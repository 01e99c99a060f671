"""The biLM's forward pass as a `jax.export` artifact (StableHLO): written from any machine, run with jax alone.

    stablehlo.write("elmo_stablehlo/", options, params)      # lowered for cpu, cuda and tpu, here on a CPU
    run = stablehlo.load_exported("elmo_stablehlo/")         # a fresh process: no flax, no model code
    out = run(char_ids)                                      # {"layers": [b, L + 1, t, 2P], "mask": [b, t]}

A folder of three files: `model.stablehlo` (the serialized `jax.export.Exported`: batch and time symbolic,
lowered for `PLATFORMS`), `weights.npz` (the params, one array per `/`-joined name, `param_names.flat`) and
`stablehlo.json` (format version, the input and output contract). The weights are the exported function's first
argument, not constants folded into the module: one module for any weights of the shape, and a module file that
stays small. The input is what `data.chars.batch_to_ids` returns (int32 `[batch, time, token_width]`, 0 = no
token, without `<S>`/`</S>`: the forward adds them to each sentence, as the `Embedder` does); an EFML-variant
model takes its own ids (`chars.LexiconIds`: the word id first). The forward is the `Embedder`'s stateless one
(its char CNN, then its biLM program), so on CPU a sentence a call gives the Embedder's layers bit for bit; in a
batch, XLA:CPU may round a row by where it sits in it (~1e-7; tests/interop/test_portable.py).

`load_exported` imports jax and numpy only (not flax, not the model): a folder is read as hostile until checked,
each name and shape against the module's own argument list.
"""
from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Any, Callable

import jax
import numpy as np

from elmo_jax.formats import param_names
from elmo_jax.runtime import json_bounded

MODULE_FILE, WEIGHTS_FILE, META_FILE = "model.stablehlo", "weights.npz", "stablehlo.json"
FORMAT = "elmo_jax.stablehlo"
VERSION = 1
PLATFORMS = ("cpu", "cuda", "tpu")
_NPY_HEADER = 4096  # bytes a .npy member holds beyond its data (numpy writes 64 to a few hundred)


class ExportedError(ValueError):
  """An artifact folder that is not what `write` writes; one line naming the file."""


def forward(options: dict[str, Any]) -> Callable[[dict[str, Any], jax.Array], dict[str, jax.Array]]:
  """The stateless forward of a model of `options`: (flat params, char ids [batch, time, token_width]) ->
  {"layers": [batch, n_layers + 1, time, 2P] float32 (0 past each length), "mask": [batch, time] bool}.
  The Embedder's two programs in one: the char CNN on every position (its `cnn_into`), then the biLM over the
  first max(length) steps (its `layers`, `skip_padding=True`)."""
  from elmo_jax.model import BiLM, BiLMConfig  # pylint: disable=g-import-not-at-top  (the loader needs no flax)
  model = BiLM(BiLMConfig.from_options(options))

  def run(weights: dict[str, Any], char_ids: jax.Array) -> dict[str, jax.Array]:
    params = {"params": param_names.nested(weights)}
    mask = jax.numpy.any(char_ids > 0, axis=-1)
    emb = model.apply(params, char_ids, method=BiLM.embed_tokens)
    out = model.apply(params, token_embeddings=emb, mask=mask, skip_padding=True)
    return {"layers": out["layers"], "mask": out["mask"]}

  return run


def export(options: dict[str, Any], params: dict[str, Any], platforms: tuple[str, ...] = PLATFORMS
           ) -> jax.export.Exported:
  """`forward(options)` lowered for `platforms` with batch and time symbolic (no device of them needed)."""
  from elmo_jax.model import BiLMConfig  # pylint: disable=g-import-not-at-top  (the loader needs no flax)
  width = BiLMConfig.from_options(options).token_width
  weights = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in param_names.flat(params).items()}
  ids = jax.ShapeDtypeStruct(jax.export.symbolic_shape(f"b, t, {width}"), np.int32)
  return jax.export.export(jax.jit(forward(options)), platforms=platforms)(weights, ids)


def require_flatbuffers() -> None:
  """ExportedError (one line) unless `flatbuffers` imports: jax.export serializes with it, and jax does not
  require it (elmo_jax's dependencies and both locks name it)."""
  try:
    import flatbuffers  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise ExportedError("StableHLO artifacts need the flatbuffers package (jax.export's serialization): "
                        "pip install flatbuffers, or pip install -r requirements.txt") from None


def write(folder: str, options: dict[str, Any], params: dict[str, Any],
          platforms: tuple[str, ...] = PLATFORMS) -> None:
  """Writes the artifact's three files into `folder` (an existing, empty one: `convert` gives a temp folder
  renamed into place when whole)."""
  from elmo_jax.model import BiLMConfig  # pylint: disable=g-import-not-at-top  (the loader needs no flax)
  require_flatbuffers()
  cfg = BiLMConfig.from_options(options)
  exported = export(options, params, platforms)
  with open(os.path.join(folder, MODULE_FILE), "wb") as f:
    f.write(exported.serialize())
  np.savez(os.path.join(folder, WEIGHTS_FILE), **param_names.flat(params))
  meta = {"format": FORMAT, "version": VERSION, "platforms": list(exported.platforms),
          "input": {"name": "char_ids", "dtype": "int32", "shape": ["batch", "time", cfg.token_width],
                    "ids": "efml-lexicon" if cfg.n_words or cfg.special_ids else "bilm-tf-bytes",
                    "sentence_boundaries": "added by the model: give the tokens alone"},
          "outputs": {"layers": {"dtype": "float32", "shape": ["batch", cfg.n_layers + 1, "time", cfg.output_dim]},
                      "mask": {"dtype": "bool", "shape": ["batch", "time"]}}}
  with open(os.path.join(folder, META_FILE), "w") as f:
    json.dump(meta, f, indent=2)


class Loaded:
  """A deserialized artifact and its weights: `loaded(char_ids [batch, time, width] int32)` ->
  {"layers": [batch, n_layers + 1, time, 2P], "mask": [batch, time]} (numpy)."""

  def __init__(self, exported: jax.export.Exported, weights: dict[str, np.ndarray], meta: dict[str, Any]):
    self.exported, self.meta = exported, meta
    self.weights = {k: jax.device_put(v) for k, v in weights.items()}
    self._call = jax.jit(exported.call)

  @property
  def token_width(self) -> int:
    return int(self.meta["input"]["shape"][2])

  def __call__(self, char_ids: Any) -> dict[str, np.ndarray]:
    ids = np.asarray(char_ids)
    if ids.dtype != np.int32 or ids.ndim != 3 or ids.shape[2] != self.token_width:
      raise ValueError(f"char_ids must be int32 [batch, time, {self.token_width}], got {ids.dtype} {list(ids.shape)}")
    return {k: np.asarray(v) for k, v in self._call(self.weights, ids).items()}


def _problem(folder: str) -> str | None:
  for name in (MODULE_FILE, WEIGHTS_FILE, META_FILE):
    if not os.path.isfile(os.path.join(folder, name)):
      return f"{folder}: no {name} (a folder written by `elmo-jax convert --format=stablehlo`)"
  return None


def load_exported(folder: str | os.PathLike) -> Loaded:
  """Reads a folder `write` wrote. Raises ExportedError (one line) for a folder that is not one."""
  folder = os.fspath(folder)
  require_flatbuffers()
  problem = _problem(folder)
  if problem:
    raise ExportedError(problem)
  meta_file = os.path.join(folder, META_FILE)
  try:
    meta = json_bounded.load(meta_file)
  except (OSError, ValueError) as e:
    raise ExportedError(f"{meta_file}: not JSON ({e})") from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
    raise ExportedError(f"{meta_file}: not an {FORMAT} version {VERSION} description")
  with open(os.path.join(folder, MODULE_FILE), "rb") as f:
    blob = f.read()
  try:
    exported = jax.export.deserialize(bytearray(blob))
  except Exception as e:  # pylint: disable=broad-except  (whatever the deserializer raises on a damaged file)
    raise ExportedError(f"{os.path.join(folder, MODULE_FILE)}: not a jax.export artifact ({type(e).__name__})"
                        ) from None
  return Loaded(exported, _weights(os.path.join(folder, WEIGHTS_FILE), exported), meta)


def _weights(path: str, exported: jax.export.Exported) -> dict[str, np.ndarray]:
  """The weights file's arrays, each checked against the module's own argument of that name: the members' names
  and uncompressed sizes before any is read (a small npz may inflate to gigabytes), then dtype, shape and
  finite values."""
  wanted_tree = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)[0][0]
  try:
    with zipfile.ZipFile(path) as z:
      sizes = {info.filename.removesuffix(".npy"): info.file_size for info in z.infolist()}
    if set(sizes) != set(wanted_tree):
      missing = sorted(set(wanted_tree) - set(sizes)) or sorted(set(sizes) - set(wanted_tree))
      raise ExportedError(f"{path}: its arrays are not the module's (first difference: {missing[0]})")
    for name, aval in wanted_tree.items():
      need = np.dtype(aval.dtype).itemsize * int(np.prod(aval.shape, dtype=np.int64))
      if sizes[name] > need + _NPY_HEADER:
        raise ExportedError(f"{path}: {name} inflates to {sizes[name]:,} bytes; the module's {aval.dtype} "
                            f"{list(aval.shape)} is {need:,}")
    with np.load(path, allow_pickle=False) as npz:
      found = {name: npz[name] for name in npz.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError) as e:
    if isinstance(e, ExportedError):
      raise
    raise ExportedError(f"{path}: not a readable .npz ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
                        ) from None
  for name, aval in wanted_tree.items():
    if found[name].shape != tuple(aval.shape) or found[name].dtype != aval.dtype:
      raise ExportedError(f"{path}: {name} is {found[name].dtype} {list(found[name].shape)}, the module takes "
                          f"{aval.dtype} {list(aval.shape)}")
    if np.issubdtype(found[name].dtype, np.floating) and not np.isfinite(found[name]).all():
      raise ExportedError(f"{path}: {name} holds NaN or infinite values (a damaged or diverged model)")
  return found
