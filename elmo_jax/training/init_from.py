"""`config.init_from`: start a new run from another run's checkpoint or from an original ELMo hdf5.

This is bilm-tf's restart / fine-tune-on-a-new-domain use: the biLM weights are taken over, the softmax
only when the vocabulary is the same (its rows are per word), and the optimizer starts fresh.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any

import jax
import numpy as np

from elmo_jax import files
from elmo_jax import options as options_lib
from elmo_jax import pretrained
from elmo_jax import storage
from elmo_jax import weights as weights_lib
from elmo_jax.training.checkpoint import Checkpointer, newest_meta
from elmo_jax.training.resume import options_difference


# Ends the description `load` returns when the source gives no softmax for this run's vocabulary.
NEW_SOFTMAX = "new softmax"


class InitFromError(ValueError):
  """`config.init_from` cannot be used; the message names the path and what is wrong."""


def _checkpoint_dir(path: str) -> tuple[str, int | None] | None:
  """(checkpoints dir, step or None=latest) if `path` is a workdir, its checkpoints/ or one step folder (in
  a bucket too: Orbax reads it there)."""
  if storage.isdir(storage.join(path, "checkpoints")):
    return storage.join(path, "checkpoints"), None
  path = path.rstrip("/") if storage.is_remote(path) else os.path.normpath(path)
  name = path.rsplit("/", 1)[-1]
  if name.isdigit() and storage.isdir(storage.join(path, "state")):
    return path.rsplit("/", 1)[0], int(name)
  if any(n.isdigit() for n in storage.listdir(path)):
    return path, None
  return None


def _source(path: str) -> tuple[str, tuple[str, int | None] | None]:
  """(path, its checkpoints) for `config.init_from`: a local path made absolute; in a bucket, checkpoints
  stay there and ELMo files are read from their local copy. InitFromError when there is nothing."""
  if not storage.is_remote(path):
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
      raise InitFromError(f"config.init_from={path}: no such file or folder")
    return path, _checkpoint_dir(path)
  if not storage.exists(path):
    raise InitFromError(f"config.init_from={path}: no such object or folder in the bucket")
  found = _checkpoint_dir(path)
  return (path, found) if found is not None else (storage.local(path), None)


def _elmo_files(path: str) -> tuple[str, str]:
  """(options.json, weights.hdf5) from an options.json, an hdf5 or a folder holding both."""
  what = "a run's workdir, its checkpoints/ or a step, ELMo's options.json or weights .hdf5, or a folder of them"
  if os.path.isfile(path) and not path.endswith((".hdf5", ".h5", ".json")):
    raise InitFromError(f"config.init_from={path} is {files.looks_like(path)}; expected {what}")
  if (os.path.isdir(path) and not glob.glob(os.path.join(path, "*.hdf5"))
      and not os.path.exists(os.path.join(path, "options.json"))):
    raise InitFromError(f"config.init_from={path} is a folder with no checkpoints, options.json or *.hdf5; "
                        f"expected {what}")
  folder = path if os.path.isdir(path) else os.path.dirname(path)
  if path.endswith(".hdf5") or path.endswith(".h5"):
    options = os.path.join(folder, "options.json")
    candidates = sorted(glob.glob(os.path.join(folder, "*options*.json")))
    return (options if os.path.exists(options) else (candidates[0] if len(candidates) == 1 else options)), path
  options = path if path.endswith(".json") else os.path.join(folder, "options.json")
  weights = sorted(glob.glob(os.path.join(folder, "*.hdf5")))
  if len(weights) != 1:
    raise InitFromError(f"config.init_from={path}: expected one *.hdf5 beside {options}, found {len(weights)}; "
                        "point init_from at the hdf5 file itself")
  return options, weights[0]


def check(path: str, options: dict[str, Any]) -> None:
  """What `load` would refuse, found from the files' names and JSON alone (no weights read, nothing
  downloaded), for the trainer's preflight: a missing path, a checkpoint or ELMo files of another model
  shape. Released names and URLs are checked when they are loaded. Raises InitFromError."""
  if pretrained.is_model_spec(path):
    return
  path, found = _source(path)
  if found is not None:
    newest = newest_meta(found[0]) if found[1] is None else None
    if found[1] is not None:  # one step folder: its own meta
      try:
        newest = found[1], json.loads(storage.read_bytes(storage.join(path, "meta", "metadata")))
      except (OSError, ValueError):
        newest = None
    if newest is None:
      raise InitFromError(f"config.init_from={path}: no readable checkpoint there")
    saved = newest[1].get("config", {}).get("options", {})
  else:
    options_file, weight_file = _elmo_files(path)
    for needed in (options_file, weight_file):
      if not os.path.isfile(needed):
        raise InitFromError(f"config.init_from={path}: {needed} not found")
    try:
      saved = options_lib.validate(options_lib.load(options_file), options_file)
    except (OSError, ValueError) as e:
      raise InitFromError(f"config.init_from={path}: {str(e).splitlines()[0]}") from None
  diff = options_difference(saved, options)
  if diff is not None:
    raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff}")


def _restore_params(ckpt_dir: str, step: int | None) -> tuple[dict[str, Any], dict[str, Any], int]:
  """Params (numpy) and meta of the newest good step of another run, read-only (nothing is moved there)."""
  ckpt = Checkpointer(ckpt_dir, read_only=True)

  def load(s: int) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = ckpt.manager.restore(s, args=_composite(meta=None))["meta"]
    # Every array onto this process's first device: the source run may have had another mesh.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                                      ckpt.manager.item_metadata(s)["state"])
    state = ckpt.manager.restore(s, args=_composite(state=abstract))["state"]
    return jax.tree_util.tree_map(np.asarray, state["params"]), meta

  try:
    found = ckpt.restore_newest(load, None if step is None else [step], verified_must_load=False)
  finally:
    ckpt.manager.close()
  if found is None:
    raise InitFromError(f"config.init_from={ckpt_dir}: no restorable checkpoint there")
  s, (params, meta) = found
  return params, meta, s


def _composite(**items):
  import orbax.checkpoint as ocp
  args = {k: (ocp.args.JsonRestore() if k == "meta" else ocp.args.StandardRestore(v)) for k, v in items.items()}
  return ocp.args.Composite(**args)


def load(path: str, options: dict[str, Any], vocab_sha256: str) -> tuple[dict[str, Any], dict | None, str]:
  """Reads `path` -> (biLM params, softmax params or None, one-line description). Numpy, on the host.

  `path` may also be a released ELMo name (`small`, `original`, ...) or a URL (`elmo_jax.pretrained`).
  Raises InitFromError if the model shape there differs from `options` (naming the first differing key).
  """
  if pretrained.is_model_spec(path):
    return _load_elmo_files(path, *pretrained.resolve(path), options, vocab_sha256)
  path, found = _source(path)
  if found is not None:
    params, meta, step = _restore_params(*found)
    diff = options_difference(meta["config"]["options"], options)
    if diff is not None:
      raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff}")
    same_vocab = meta.get("vocab_sha256") == vocab_sha256
    softmax = params["softmax"] if same_vocab else None
    return params["bilm"], softmax, (f"checkpoint step {step} of {found[0]} "
                                     f"({'with its softmax' if same_vocab else 'new vocabulary: ' + NEW_SOFTMAX})")
  return _load_elmo_files(path, *_elmo_files(path), options, vocab_sha256)


def _load_elmo_files(path: str, options_file: str, weight_file: str, options: dict[str, Any], vocab_sha256: str
                     ) -> tuple[dict[str, Any], dict | None, str]:
  saved = options_lib.validate(options_lib.load(options_file), options_file)
  diff = options_difference(saved, options)
  if diff is not None:
    raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff} "
                        f"({options_file})")
  loaded = weights_lib.load_hdf5(weight_file, saved)
  softmax = None
  vocab_file = os.path.join(os.path.dirname(weight_file), "vocab.txt")
  if loaded["softmax"] is not None and os.path.exists(vocab_file):
    from elmo_jax.data import Vocab
    if Vocab.load(vocab_file).sha256() == vocab_sha256:
      softmax = loaded["softmax"]
  return loaded["params"], softmax, (f"ELMo weights {weight_file} "
                                     f"({'with its softmax' if softmax is not None else NEW_SOFTMAX})")


def apply(path: str, state: Any, options: dict[str, Any], vocab_sha256: str, optimizer,
          state_shardings: Any) -> tuple[Any, str]:
  """`state` (freshly initialised) with the biLM (and maybe softmax) of `path` and a fresh optimizer."""
  bilm, softmax, description = load(path, options, vocab_sha256)
  params = dict(state.params)
  expected = jax.tree_util.tree_structure(params["bilm"])
  if jax.tree_util.tree_structure(bilm) != expected:
    raise InitFromError(f"config.init_from={path}: parameter tree differs from the model's "
                        f"({json.dumps(sorted(bilm))} vs {json.dumps(sorted(params['bilm']))})")
  params["bilm"] = bilm
  if softmax is not None:
    params["softmax"] = softmax

  def put(host, like):
    host = np.asarray(host, like.dtype)
    if host.shape != like.shape:
      raise InitFromError(f"config.init_from={path}: a parameter has shape {host.shape}, the model {like.shape}")
    # Works on every process of a multi-host run: each one reads the same file and supplies its shards.
    return jax.make_array_from_callback(like.shape, like.sharding, lambda index: host[index])

  params = jax.tree_util.tree_map(put, params, state.params)
  opt_state = jax.jit(optimizer.init, out_shardings=state_shardings.opt_state)(params)
  return state.replace(params=params, opt_state=opt_state), description
