"""`config.init_from`: start a new run from another run's checkpoint or from an original ELMo hdf5.

This is bilm-tf's restart / fine-tune-on-a-new-domain use: the biLM weights are taken over, the softmax
only when the vocabulary is the same (its rows are per word), and the optimizer starts fresh.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from elmo_jax.interop import loaded
from elmo_jax.interop import options as options_lib
from elmo_jax.interop import pretrained
from elmo_jax.runtime import storage
from elmo_jax.interop import weights as weights_lib
from elmo_jax.training.checkpoint import Checkpointer, newest_meta
from elmo_jax.training.resume import options_difference


# Ends the description `load` returns when the source gives no softmax for this run's vocabulary.
NEW_SOFTMAX = "new softmax"


class InitFromError(ValueError):
  """`config.init_from` cannot be used; the message names the path and what is wrong."""


def _resolve(path: str) -> pretrained.ResolvedModel:
  """`pretrained.resolve_model(use="init_from")`, its errors as InitFromError naming the config field."""
  try:
    return pretrained.resolve_model(path, use="init_from")
  except pretrained.SourceError as e:
    raise InitFromError(f"config.init_from={e}") from None


def check(path: str, options: dict[str, Any]) -> None:
  """What `load` would refuse, found from the files' names, JSON and HDF5 metadata alone (no weights read,
  nothing downloaded), for the trainer's preflight: a missing path, a checkpoint or ELMo files of another
  model shape, a weight file lacking a dataset or holding one of another shape. Released names and URLs are
  checked when they are loaded. Raises InitFromError."""
  if pretrained.is_model_spec(path):
    return
  source = _resolve(path)
  path, found = source.path, source.checkpoints
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
    options_file, weight_file = source.files
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
  if found is None:  # the weight file's datasets and shapes, from its metadata (what load_hdf5 would refuse)
    try:
      weights_lib.check_hdf5(weight_file, saved)
    except weights_lib.WeightFileError as e:
      raise InitFromError(f"config.init_from={path}: {e}") from None


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

  `path` may also be a released ELMo name (`small`, `original`, ...) or a URL (`elmo_jax.interop.pretrained`).
  Raises InitFromError if the model shape there differs from `options` (naming the first differing key).
  """
  source = _resolve(path)
  path, found = source.path, source.checkpoints
  if found is not None:
    params, meta, step = _restore_params(*found)
    diff = options_difference(meta["config"]["options"], options)
    if diff is not None:
      raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff}")
    same_vocab = meta.get("vocab_sha256") == vocab_sha256
    softmax = params["softmax"] if same_vocab else None
    return params["bilm"], softmax, (f"checkpoint step {step} of {found[0]} "
                                     f"({'with its softmax' if same_vocab else 'new vocabulary: ' + NEW_SOFTMAX})")
  return _load_elmo_files(source, options, vocab_sha256)


def _load_elmo_files(source: pretrained.ResolvedModel, options: dict[str, Any], vocab_sha256: str
                     ) -> tuple[dict[str, Any], dict | None, str]:
  """The ELMo files' biLM (`loaded.load_model`), and their softmax when the vocab.txt beside them is this run's
  vocabulary."""
  path, (options_file, weight_file) = source.path, source.files
  model = loaded.load_model(source)
  diff = options_difference(options_lib.validate(model.options, options_file), options)
  if diff is not None:
    raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff} "
                        f"({options_file})")
  softmax = None
  if model.softmax is not None and source.vocab_file is not None:
    from elmo_jax.data import Vocab
    if Vocab.load(source.vocab_file).sha256() == vocab_sha256:
      softmax = model.softmax
  return model.params, softmax, (f"ELMo weights {weight_file} "
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
