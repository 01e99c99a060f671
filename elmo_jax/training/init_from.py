"""`config.init_from`: start a new run from another run's checkpoint or from any released ELMo.

This is bilm-tf's restart / fine-tune-on-a-new-domain use: the biLM weights are taken over, the softmax
only when the vocabulary is the same (its rows are per word), and the optimizer starts fresh. Sources: a run,
its checkpoints or a step; options.json + hdf5 (bilm-tf, AllenNLP, NLPL archives); an ELMoForManyLangs folder
(`formats/efml.py`: its word embedding is taken over too; its releases hold no softmax); a TF-Hub `elmo/3`
module folder (`formats/tfhub.py`); each also by released name, URL or archive.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

from elmo_jax.data import Vocab
from elmo_jax.formats import efml
from elmo_jax.formats import model_folder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import storage
from elmo_jax.sources import archive
from elmo_jax.sources import download
from elmo_jax.sources import hub
from elmo_jax.sources import loaded
from elmo_jax.sources import resolve
from elmo_jax.sources.resolve import ResolvedModel
from elmo_jax.training.checkpoint import Checkpointer, newest_meta
from elmo_jax.training.resume import options_difference


# Ends the description `load` returns when the source gives no softmax for this run's vocabulary.
NEW_SOFTMAX = "new softmax"


class InitFromError(ValueError):
  """`config.init_from` cannot be used; the message names the path and what is wrong."""


def _resolve(path: str) -> ResolvedModel:
  """`resolve.resolve_model(use="init_from")`, its errors as InitFromError naming the config field."""
  try:
    return resolve.resolve_model(path, use="init_from")
  except resolve.SourceError as e:
    raise InitFromError(f"config.init_from={e}") from None
  except download.DownloadError as e:  # a URL's 404, an HTML page for a model, a cut or bad archive
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise InitFromError(f"config.init_from={path}: {message.removeprefix(path + ': ')}") from None


def released_source(path: str) -> ResolvedModel | None:
  """What `path` names (`resolve.resolve_model`) when it (a folder, or a URL, archive or hf:// repository holding
  one) is a model that holds no training run's files: an ELMoForManyLangs folder, a TF-Hub module or elmo_jax's
  own safetensors folder; None for what `resolve_model(use="init_from")` reads (runs, checkpoints, ELMo files).
  An EFML folder missing a file is InitFromError (`efml.folder_problem`), not another format's folder."""
  if storage.is_remote(path):  # a bucket holds runs (checkpoints) and ELMo files, read as before
    return None
  local = os.path.abspath(os.path.expanduser(path))
  if os.path.isdir(local):
    if (problem := efml.folder_problem(local)) is not None:  # EFML files, not all of them: say which are missing
      raise InitFromError(f"config.init_from={problem}")
    if not (efml.is_efml_dir(local) or tfhub.is_module(local) or model_folder.is_folder(local)):
      return None
  elif path in resolve.MODELS or not (archive.is_archive(path) or download.is_url(path) or hub.is_hub_spec(path)):
    return None
  try:
    found = resolve.resolve_model(local if os.path.isdir(local) else path)
  except download.DownloadError as e:
    if os.path.isdir(local):
      raise InitFromError(f"config.init_from={path}: {str(e).splitlines()[0]}") from None
    return None
  return found if (found.tfhub_dir or found.efml_dir or found.folder_dir) is not None else None


def _kind(found: ResolvedModel) -> str:
  """What a `released_source` is, in words."""
  if found.efml_dir is not None:
    return "ELMoForManyLangs folder"
  if found.tfhub_dir is not None:
    return "TF-Hub module"
  return "safetensors model folder"


def source_files(path: str) -> tuple[str, ...]:
  """Every local file of the source `path` names (`ResolvedModel.read_files`: an EFML folder's, a TF-Hub
  module's, ELMo files and the vocabulary beside them; a run's checkpoints folder too): what the run must not
  write over (`preflight`). Fetches a URL or archive as `check` does; () for a released name or a bucket."""
  if path in resolve.MODELS or storage.is_remote(path):
    return ()
  found = released_source(path) or _resolve(path)
  return (*found.read_files, *((found.checkpoints[0],) if found.checkpoints is not None else ()))


def _load_released(found: ResolvedModel, path: str) -> loaded.LoadedModel:
  """An EFML folder, a TF-Hub module or a safetensors folder, read by the one load; InitFromError, one line."""
  try:
    return loaded.load_model(found)
  except (weights_lib.WeightFileError, ValueError, OSError) as e:
    raise InitFromError(f"config.init_from={path}: {str(e).splitlines()[0]}") from None


def source_options(path: str) -> tuple[dict[str, Any], str | None]:
  """(the model options of `path`, its EFML folder or None): what `configs/finetune.py` takes over."""
  released = released_source(path)
  if released is not None:
    model = _load_released(released, path)
    return model.options, released.efml_dir
  source = _resolve(path)
  if source.checkpoints is not None:
    found = source.checkpoints
    newest = newest_meta(found[0]) if found[1] is None else None
    if found[1] is not None:
      try:
        newest = found[1], json.loads(storage.read_bytes(storage.join(source.path, "meta", "metadata")))
      except (OSError, ValueError):
        newest = None
    if newest is None:
      raise InitFromError(f"config.init_from={path}: no readable checkpoint there")
    return newest[1].get("config", {}).get("options", {}), None
  try:
    return loaded.read_options(source), None
  except (OSError, ValueError) as e:
    raise InitFromError(f"config.init_from={path}: {str(e).splitlines()[0]}") from None


def check(path: str, options: dict[str, Any]) -> None:
  """What `load` would refuse, found from the files' names, JSON and HDF5 metadata alone (no weights read),
  for the trainer's preflight: a missing path, a checkpoint or ELMo files of another
  model shape, a weight file lacking a dataset or holding one of another shape. A URL or archive is fetched
  and unpacked here (into the cache, which the run's load then reuses), so a 404, an HTML page or a cut archive
  is refused before the workdir is written; released names (this project's own URLs) when they are loaded.
  Raises InitFromError."""
  if path in resolve.MODELS:
    return
  released = released_source(path)
  if released is not None:  # reads the weights too: an EFML folder's word.dic must agree with them
    saved = _load_released(released, path).options
    diff = options_difference(saved, options)
    if diff is not None:
      raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff}")
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
      saved = loaded.read_options(source)
    except (OSError, ValueError) as e:
      raise InitFromError(f"config.init_from={path}: {str(e).splitlines()[0]}") from None
  diff = options_difference(saved, options)
  if diff is not None:
    raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff}")
  if found is None:  # the weight file's datasets and shapes, from its metadata (what load_hdf5 would refuse)
    try:
      loaded.check_weights(source, saved)
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

  `path` may also be a released ELMo name (`small`, `original`, ...) or a URL (`elmo_jax.sources.resolve`).
  Raises InitFromError if the model shape there differs from `options` (naming the first differing key).
  """
  released = released_source(path)
  if released is not None:
    model = _load_released(released, path)
    diff = options_difference(model.options, options)
    if diff is not None:
      raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff}")
    params = model.params
    what = f"{_kind(released)} {released.efml_dir or released.tfhub_dir or released.folder_dir}"
    words = options["char_cnn"].get("word_embedding", {}).get("n_words", 0)
    taken = "char CNN" + (f", word embedding ({words:,} words)" if words else "") + ", highways, projection, biLM"
    softmax = _same_vocab_softmax(model, vocab_sha256)
    if softmax is not None:
      return params, softmax, f"{what}: took over its {taken} and its softmax"
    why = "no softmax in the release" if model.softmax is None else "another vocabulary"
    return params, None, f"{what}: took over its {taken}; {why}: a new one ({NEW_SOFTMAX})"
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


def _load_elmo_files(source: ResolvedModel, options: dict[str, Any], vocab_sha256: str
                     ) -> tuple[dict[str, Any], dict | None, str]:
  """The ELMo files' biLM (`loaded.load_model`), and their softmax when the vocab.txt beside them is this run's
  vocabulary."""
  path, (options_file, weight_file) = source.path, source.files
  model = loaded.load_model(source)
  diff = options_difference(options_lib.validate(model.options, options_file), options)
  if diff is not None:
    raise InitFromError(f"config.init_from={path}: model shape differs from config.options: {diff} "
                        f"({options_file})")
  softmax = _same_vocab_softmax(model, vocab_sha256)
  return model.params, softmax, (f"ELMo weights {weight_file} "
                                 f"({'with its softmax' if softmax is not None else NEW_SOFTMAX})")


def _same_vocab_softmax(model: loaded.LoadedModel, vocab_sha256: str) -> dict[str, Any] | None:
  """The model's softmax where its vocabulary (the vocab.txt beside it) is this run's (its rows are per word)."""
  if model.softmax is None or model.vocab_file is None:
    return None
  return model.softmax if Vocab.load(model.vocab_file).sha256() == vocab_sha256 else None


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
