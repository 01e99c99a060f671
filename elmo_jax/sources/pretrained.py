"""A one-call load of any model spec into Flax (`load_elmo`, `load_elmo_nnx`, `load`), and the names of the
resolver (`resolve.resolve_model`) and of the released models (`released.MODELS`) kept importable from here.

    model = pretrained.resolve_model("original")                  # downloads once, then works offline
    options_file, weight_file = model.files                       # also: pretrained.resolve("original")
    elmo, variables = pretrained.load_elmo("small", dropout=0.5, l2_coef=1e-3)
    elmo = pretrained.load_elmo_nnx("small", rngs=nnx.Rngs(0), dropout=0.5)  # the same as a Flax NNX module
    model = loaded.load_model(pretrained.resolve_model("small"))  # options, params, softmax, vocab, ...

A task model's optimizer that keeps the biLM still: `elmo_jax.training.freeze.freeze_bilm`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from elmo_jax.formats import efml
from elmo_jax.model import BiLMConfig, Elmo, elmo_nnx, elmo_variables
from elmo_jax.sources import loaded
from elmo_jax.sources.released import ALLENNLP_BASE, MODELS, Released, base_url  # noqa: F401  (names kept here)
from elmo_jax.sources.resolve import (ResolvedModel, SourceError, efml_folder, is_model_spec,  # noqa: F401
                                      resolve, resolve_files, resolve_model)


def load(name_or_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """(options, biLM params as numpy) of a released name, folder (a TF-Hub module's too) or URL
  (`loaded.load_model`, whose `LoadedModel` also holds the softmax, vocabulary and a module's mix)."""
  model = loaded.load_model(_bilm_tf_ids(name_or_path, resolve_model(name_or_path)))
  if model.token_ids is not None:  # a safetensors folder of an EFML-style model: known once it is read
    _bilm_tf_ids(name_or_path, dataclasses.replace(model.source, efml_dir=model.source.path))
  return model.options, model.params


def _bilm_tf_ids(spec: str, found: ResolvedModel) -> ResolvedModel:
  """`found`, unless its char ids are not bilm-tf's (an EFML folder's are `chars.LexiconIds`): `Elmo` would
  take bilm-tf's ids and give a wrong model, so it is refused in one line."""
  if found.efml_dir is not None:
    raise efml.EFMLError(f"{spec}: an ELMoForManyLangs model; Embedder.from_pretrained loads it, "
                         "load_elmo / load do not yet")
  return found


def load_elmo(name_or_path: str, *, vocab_to_cache: Sequence[str] | None = None, **elmo_kwargs):
  """(`Elmo` module, ready `variables`) of a released name, folder or URL, in one call.

  `elmo_kwargs` go to `Elmo` (num_output_representations, dropout, do_layer_norm, l2_coef, ...). With
  `vocab_to_cache` the variables hold the char-CNN table of those words ("token_cache").
  """
  options, params = load(name_or_path)
  if vocab_to_cache is not None:
    vocab_to_cache = tuple(vocab_to_cache)
  elmo = Elmo(BiLMConfig.from_options(options), vocab_to_cache=vocab_to_cache, **elmo_kwargs)
  return elmo, elmo_variables(elmo, params)


def load_elmo_nnx(name_or_path: str, *, rngs, dropout: float = 0.5, l2_coef: float = 0.0,
                  num_output_representations: int = 1, requires_grad: bool = False, **elmo_kwargs):
  """`load_elmo`'s model as a Flax NNX module (`model.elmo_nnx.ElmoNNX`, linen `Elmo`'s outputs bit for bit): its
  biLM weights are `BiLMWeight`s, left alone by `nnx.Optimizer(..., wrt=nnx.Param)`; `rngs`: the dropout stream."""
  options, params = load(name_or_path)
  elmo = Elmo(BiLMConfig.from_options(options), dropout=dropout, l2_coef=l2_coef, requires_grad=requires_grad,
              num_output_representations=num_output_representations, **elmo_kwargs)
  return elmo_nnx.ElmoNNX(elmo, params, rngs=rngs)


__all__ = ["MODELS", "Released", "ResolvedModel", "SourceError", "resolve_model", "resolve", "load", "load_elmo",
           "load_elmo_nnx", "is_model_spec"]
