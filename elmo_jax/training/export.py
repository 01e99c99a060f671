"""Exports a trained biLM in its format (`config.export_format`): bilm-tf's `export/{options.json,weights.hdf5,
vocab.txt}`, an ELMoForManyLangs release folder (`efml_export`) for an EFML-style model, with the run's
lexicons (`variant.LEXICON_DIR`), or elmo_jax's own folder (`safetensors`: `model_folder`, any model)."""
from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import numpy as np

from elmo_jax.formats import model_folder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files
from elmo_jax.runtime.run_layout import EXPORT_DIR, OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE
from elmo_jax.data import lexicon as lexicon_lib
from elmo_jax.formats import efml_export


def export_model(workdir: str, params: dict[str, Any], options: dict[str, Any], fmt: str = "bilm-hdf5") -> str:
  """Writes options.json + weights.hdf5 (with the softmax) + vocab.txt atomically, or (`fmt="efml"`) an EFML
  folder (config.json, the architecture JSON, char.dic, word.dic, token_embedder.pkl, encoder.pkl: the
  release holds no softmax), or (`fmt="safetensors"`) elmo_jax's own folder (config.json, model.safetensors with
  the softmax, vocab.txt or the lexicons, a card); returns the folder.

  The folder is built beside the old one and swapped in, so a reader never sees a mix of two exports.
  """
  final = os.path.join(workdir, EXPORT_DIR)
  host = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x), np.float32), params)
  if fmt == "safetensors":
    with files.atomic_dir(final) as tmp:
      vocab = os.path.join(workdir, VOCAB_FILE)
      model_folder.write(tmp, options, host["bilm"], softmax=host["softmax"],
                         vocab_file=vocab if os.path.exists(vocab) else None,
                         lexicon=_lexicon(workdir, options) if model_folder.variant_of(options) == model_folder.EFML
                         else None, card=model_folder.run_card(workdir, options))
    return final
  if fmt == "efml":
    lex = _lexicon(workdir, options)
    with files.atomic_dir(final) as tmp:
      efml_export.write(tmp, options, host["bilm"], lex.char2id, lex.word2id)
    return final
  with files.atomic_dir(final) as tmp:
    options_lib.save(options, os.path.join(tmp, OPTIONS_FILE))
    weights_lib.save_hdf5(os.path.join(tmp, WEIGHTS_FILE), host["bilm"], options, softmax=host["softmax"])
    vocab = os.path.join(workdir, VOCAB_FILE)
    if os.path.exists(vocab):
      shutil.copyfile(vocab, os.path.join(tmp, VOCAB_FILE))
  return final


def _lexicon(workdir: str, options: dict[str, Any]):
  """The run's char.dic / word.dic (`variant.LEXICON_DIR`) of an EFML-style model."""
  from elmo_jax.training.variant import LEXICON_DIR  # pylint: disable=g-import-not-at-top
  cnn = options["char_cnn"]
  return lexicon_lib.read(os.path.join(workdir, LEXICON_DIR), int(cnn["max_characters_per_token"]),
                          bool(cnn.get("word_embedding", {}).get("dim")))
