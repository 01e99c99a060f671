"""An ELMoForManyLangs (EFML) release folder written from our options and `BiLM` params, without torch.

    efml_export.write(folder, options, params, char2id, word2id)   # config.json, ARCH.json, char.dic, word.dic,
                                                                    # token_embedder.pkl, encoder.pkl

The inverse of `efml.load`: the same keys, key order, shapes and dtypes (float32) as EFML's `Model` saves
(`token_embedder.state_dict()`, `encoder.state_dict()`), in PyTorch's zip format (`torch_save`), which EFML's
`Embedder` (`torch.load`, `weights_only=True` by default) reads. Our TF gate order (i, j, f, o) goes back to
AllenNLP's (i, f, g, o): a permutation, so a folder read and written again holds the same bits. The dics are
written as EFML writes them (`token<TAB>id`, by id). The caller makes the folder appear whole
(`files.atomic_dir`).
"""
from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np

from elmo_jax.data.lexicon import dic_text
from elmo_jax.formats import efml
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import torch_save
from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded


class EFMLExportError(ValueError):
  """A model that an EFML folder cannot hold; one line naming what."""


def is_efml_variant(options: dict[str, Any]) -> bool:
  """True for options of EFML's model shape (a char lexicon, AllenNLP's cell): what an EFML folder holds."""
  cnn = options["char_cnn"]
  return "char_vocab_size" in cnn and cnn.get("highway") == "allennlp" and not options["lstm"].get(
      "implicit_forget_bias", True)


def architecture_name(options: dict[str, Any]) -> str:
  """EFML's naming of its architecture JSONs: cnn_{char_dim}_{word_dim}_{projection}_{cell}_sample."""
  cnn, lstm = options["char_cnn"], options["lstm"]
  return (f"cnn_{cnn['embedding']['dim']}_{cnn.get('word_embedding', {}).get('dim', 0)}_"
          f"{lstm['projection_dim']}_{lstm['dim']}_sample")


def arch_name_of(folder: str) -> str | None:
  """The architecture JSON's name (without .json) that an EFML folder's config.json names, else None."""
  try:
    named = json_bounded.load(os.path.join(folder, efml.CONFIG)).get("config_path")
  except (OSError, ValueError, AttributeError):
    return None
  return os.path.splitext(os.path.basename(named))[0] if isinstance(named, str) and named else None


def architecture(options: dict[str, Any]) -> dict[str, Any]:
  """The architecture JSON EFML's `Model` is built from (the classifier and dropout only matter to its trainer)."""
  cnn, lstm = options["char_cnn"], options["lstm"]
  return {
      "encoder": {"name": "elmo", "projection_dim": lstm["projection_dim"], "cell_clip": lstm.get("cell_clip"),
                  "proj_clip": lstm.get("proj_clip"), "dim": lstm["dim"], "n_layers": lstm["n_layers"]},
      "token_embedder": {"name": "cnn", "activation": cnn.get("activation", "relu"),
                         "filters": [list(f) for f in cnn["filters"]], "n_highway": cnn.get("n_highway", 0),
                         "word_dim": cnn.get("word_embedding", {}).get("dim", 0), "char_dim": cnn["embedding"]["dim"],
                         "max_characters_per_token": cnn["max_characters_per_token"]},
      "classifier": {"name": "sampled_softmax", "n_samples": 8192},
      "dropout": 0.1,
  }


def _f32(x) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x, np.float32))


def token_embedder_state(options: dict[str, Any], params: dict[str, Any]) -> dict[str, np.ndarray]:
  """`params["char_cnn"]` as EFML's ConvTokenEmbedder state dict (keys in its order)."""
  cnn, p = options["char_cnn"], params["char_cnn"]
  out: dict[str, np.ndarray] = collections.OrderedDict()
  if cnn.get("word_embedding", {}).get("n_words"):
    out["word_emb_layer.embedding.weight"] = _f32(p["word_embed"])
  out["char_emb_layer.embedding.weight"] = _f32(p["char_embed"])
  for i in range(len(cnn["filters"])):  # ours [width, in, out] -> torch Conv1d [out, in, width]
    out[f"convolutions.{i}.weight"] = _f32(np.asarray(p[f"W_cnn_{i}"]).transpose(2, 1, 0))
    out[f"convolutions.{i}.bias"] = _f32(p[f"b_cnn_{i}"])
  for k in range(cnn.get("n_highway", 0)):  # one Linear(d, 2d): the transform's rows, then the gate's
    h = p[f"CNN_high_{k}"]
    out[f"highways._layers.{k}.weight"] = _f32(np.concatenate([np.asarray(h["W_transform"]).T,
                                                               np.asarray(h["W_carry"]).T]))
    out[f"highways._layers.{k}.bias"] = _f32(np.concatenate([h["b_transform"], h["b_carry"]]))
  out["projection.weight"] = _f32(np.asarray(p["CNN_proj"]["W_proj"]).T)
  out["projection.bias"] = _f32(p["CNN_proj"]["b_proj"])
  return out


def encoder_state(options: dict[str, Any], params: dict[str, Any]) -> dict[str, np.ndarray]:
  """`params["lstm"]` as EFML's ElmobiLm state dict: layer by layer, forward then backward."""
  lstm = options["lstm"]
  cell, proj = lstm["dim"], lstm["projection_dim"]
  # TF's gate blocks (i, j, f, o) -> AllenNLP's (i, f, g, o): swapping blocks 1 and 2 is its own inverse
  order = np.concatenate([np.arange(cell) + g * cell for g in (0, 2, 1, 3)])
  out: dict[str, np.ndarray] = collections.OrderedDict()
  for k in range(lstm["n_layers"]):
    for direction in ("forward", "backward"):
      name = f"{direction}_layer_{k}"
      p = params["lstm"][name]
      w = np.asarray(p["W_0"]).T[order]  # [4 cell, input + state]
      out[f"{name}.input_linearity.weight"] = _f32(w[:, :proj])
      out[f"{name}.state_linearity.weight"] = _f32(w[:, proj:])
      out[f"{name}.state_linearity.bias"] = _f32(np.asarray(p["B"])[order])
      out[f"{name}.state_projection.weight"] = _f32(np.asarray(p["W_P_0"]).T)
  return out


def check(options: dict[str, Any], params: dict[str, Any], char2id: dict[str, int],
          word2id: dict[str, int] | None) -> None:
  """EFMLExportError (one line) unless the options, params and lexicons make one EFML model."""
  if not is_efml_variant(options):
    raise EFMLExportError("an EFML folder holds EFML's model shape only (Unicode chars through char.dic, AllenNLP's "
                          "highway and cell); this model has bilm-tf's byte char ids: export it as bilm-hdf5")
  cnn = options["char_cnn"]
  rows = np.shape(params["char_cnn"]["char_embed"])[0]
  if len(char2id) != rows or max(char2id.values()) >= rows:
    raise EFMLExportError(f"char.dic has {len(char2id):,} entries, the char embedding {rows:,} rows")
  n_words = cnn.get("word_embedding", {}).get("n_words", 0)
  if n_words and (word2id is None or len(word2id) != n_words or max(word2id.values()) >= n_words):
    raise EFMLExportError(f"word.dic has {len(word2id or ()):,} entries, the word embedding {n_words:,} rows")


def write(folder: str, options: dict[str, Any], params: dict[str, Any], char2id: dict[str, int],
          word2id: dict[str, int] | None, arch_name: str | None = None) -> None:
  """Writes the six files of an EFML folder into `folder` (existing, empty: the caller's atomic_dir)."""
  options = options_lib.validate(options, "options")
  check(options, params, char2id, word2id)
  name = arch_name or architecture_name(options)
  files.write_json(os.path.join(folder, efml.CONFIG), {"config_path": f"{name}.json"})
  files.write_json(os.path.join(folder, f"{name}.json"), architecture(options))
  files.write_text(os.path.join(folder, efml.CHAR_DIC), dic_text(char2id))
  if word2id is not None:
    files.write_text(os.path.join(folder, efml.WORD_DIC), dic_text(word2id))
  torch_save.save(token_embedder_state(options, params), os.path.join(folder, efml.TOKEN_EMBEDDER))
  torch_save.save(encoder_state(options, params), os.path.join(folder, efml.ENCODER))
