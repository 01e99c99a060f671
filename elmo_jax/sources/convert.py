"""Conversion: any model `resolve_model` finds, written in bilm-tf's layout where that layout can hold it.

    convert.convert("elmo_3/", "elmo_3_bilm/")        # a TF-Hub module -> options.json + weights.hdf5, exact
    convert.convert("runs/default", "shared/model/")   # a run's export (+ its vocab.txt and softmax), same bits

Five formats are written (`WRITE_FORMATS`): bilm-tf's options.json + weights.hdf5 (`weights.save_hdf5`, the exact
writer; the softmax too where the source has one) + vocab.txt where the source has one (a run's, or one beside
the weights), an ELMoForManyLangs release folder (`efml_export`: config.json, the architecture JSON,
char.dic, word.dic, the two state dicts in PyTorch's zip format, written without torch), and elmo_jax's own
folder (`model_folder`: config.json + model.safetensors + lexicons + a model card, any model); and two that hold
the forward pass itself, for any model (docs/portable-models.md): a `jax.export` artifact (`stablehlo`) and an
ONNX model with its tokenizer description (`onnx`). Read back, every
tensor has the bits it was read with. A model is refused, in one line, in a format that cannot hold it
(`format_problem`): EFML's word embedding and code-point chars have no place in bilm-tf's layout, bilm-tf's
byte char ids none in an EFML folder.
The output folder is built beside `to` and renamed onto it (`files.atomic_dir`); a `to` that holds files, or
holds or is one of the source's files, is refused first (`storage.check_output`), so a refusal writes nothing.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import numpy as np

from elmo_jax.data import lexicon as lexicon_lib
from elmo_jax.formats import efml_export
from elmo_jax.formats import model_folder
from elmo_jax.formats import onnx_export
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import stablehlo
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE
from elmo_jax.sources import card
from elmo_jax.sources import loaded
from elmo_jax.sources import resolve

BILM_HDF5, EFML, SAFETENSORS, STABLEHLO, ONNX = "bilm-hdf5", "efml", "safetensors", "stablehlo", "onnx"
# The formats a model is written in (what `loaded.READ_FORMATS` reads is another list): three that hold the model,
# two that hold its forward pass.
WRITE_FORMATS = (BILM_HDF5, EFML, SAFETENSORS, STABLEHLO, ONNX)


class ConvertError(ValueError):
  """A conversion that cannot be done; one line, nothing written."""


def format_problem(options: dict[str, Any], fmt: str) -> str | None:
  """Why a model of these options cannot be written as `fmt` (one line), else None: the one refusal text of a
  format (the command's, a run's `config.export_format`)."""
  return _problem(efml_export.is_efml_variant(options), fmt)


def _problem(is_efml: bool, fmt: str) -> str | None:
  if fmt not in WRITE_FORMATS:
    return f"the formats written are {', '.join(WRITE_FORMATS)}"
  if fmt == BILM_HDF5 and is_efml:
    return ("an ELMoForManyLangs model cannot be held in bilm-tf's layout (options.json + weights.hdf5 has no "
            "place for its word embedding, word.dic's vectors beside the char CNN, nor its char.dic); write it as "
            "an EFML folder (--format=efml) or a safetensors folder, use the folder as it is, or a biLM trained "
            "here: a run's export/")
  if fmt == EFML and not is_efml:
    return ("a bilm-tf-shaped model (byte char ids, TF's cell) cannot be held in an ELMoForManyLangs folder "
            "(char.dic code points, AllenNLP's cell); write it as bilm-hdf5")
  return None


def load(spec: str) -> loaded.LoadedModel:
  """A model spec (`resolve_model`: a released name, a run, a folder, a TF-Hub module, a URL, an EFML folder),
  read by `loaded.load_model`."""
  return loaded.load_model(resolve.resolve_model(spec))


def check_target(to: str) -> None:
  """Refuses (one line) an output folder that holds files already: before any download or load, so that a taken
  folder costs nothing (whether `to` may be written at all, and is none of the model's files, is
  `storage.check_output`'s, once the model's files are known)."""
  if storage.is_remote(to):
    taken = [name for name in (OPTIONS_FILE, WEIGHTS_FILE) if storage.exists(storage.join(to, name))]
  else:
    taken = sorted(os.listdir(to)) if os.path.isdir(to) else []
  if taken:
    raise files.UnsafeOutputError(f"--to={to} already holds {', '.join(taken[:3])}; give a new or empty folder")


def _refuse(fmt: str, spec: str, is_efml: bool) -> None:
  """ConvertError, one line, where `fmt` cannot hold a model of this kind (`format_problem`)."""
  problem = _problem(is_efml, fmt)
  if problem:
    raise ConvertError(f"--format={fmt}: {spec + ': ' if spec else ''}{problem}")


def write(model: loaded.LoadedModel, folder: str, fmt: str = BILM_HDF5, spec: str = "") -> None:
  """Writes `model` into `folder` (replaced whole, atomically: one `atomic_dir`) in format `fmt`, one that can
  hold it (`convert` has checked: `format_problem`); `spec`: what it was read from, for a safetensors card."""
  if fmt == EFML and model.token_ids is None:
    raise ConvertError(f"--format=efml: {spec + ': ' if spec else ''}the model has no char.dic / word.dic to write")
  if fmt == BILM_HDF5:  # before the folder: a full disk was an h5py segfault
    weights = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves([model.params, model.softmax or {}]))
    weights += weights // 100 + (1 << 20)  # HDF5's headers: well under 1% and a MiB
    vocab = os.path.getsize(model.vocab_file) if model.vocab_file is not None else 0
    files.check_room(folder, weights + vocab + (1 << 16), weights, "--to")
  with files.atomic_dir(folder) as tmp:
    if fmt == SAFETENSORS:
      write_folder(model, tmp, spec, folder)
    elif fmt == STABLEHLO:  # any model: the forward pass with its weights (formats/stablehlo, onnx_export)
      stablehlo.write(tmp, model.options, model.params)
    elif fmt == ONNX:
      onnx_export.write(tmp, model.options, model.params, model.token_ids)
    elif fmt == EFML:
      folder_in = model.source.efml_dir if model.source is not None else None
      efml_export.write(tmp, model.options, model.params, model.token_ids.char2id, model.token_ids.word2id,
                        arch_name=efml_export.arch_name_of(folder_in) if folder_in else None)
    else:
      options_lib.save(model.options, os.path.join(tmp, OPTIONS_FILE))
      weights_lib.save_hdf5(os.path.join(tmp, WEIGHTS_FILE), model.params, model.options, softmax=model.softmax)
      if model.vocab_file is not None:
        shutil.copyfile(model.vocab_file, os.path.join(tmp, VOCAB_FILE))


def write_folder(model: loaded.LoadedModel, tmp: str, spec: str, folder: str) -> None:
  """Writes `model` as elmo_jax's own folder (`model_folder`) into `tmp` (`write`'s, renamed onto `folder` when
  whole), read back and run against `model` on the card's sentences (`card.max_difference`); a difference refuses
  the folder (ConvertError), none (0.0) is recorded in the card (README.md)."""
  ids = model.token_ids
  lexicon = None if ids is None else lexicon_lib.Lexicon(ids.char2id, ids.word2id, ids.max_chars)
  model_folder.write(tmp, model.options, model.params, softmax=model.softmax, mix=model.mix,
                     vocab_file=model.vocab_file, lexicon=lexicon)
  diff = card.max_difference(model, loaded.load_model(resolve.resolve_model(tmp)))
  if diff != 0.0:
    raise ConvertError(f"--to={folder}: the written folder's layers differ from the source's by {diff:.3g}; "
                       "nothing written")
  files.write_text(os.path.join(tmp, model_folder.CARD), card.text(spec, model, diff))


def convert(spec: str, to: str, fmt: str = BILM_HDF5) -> loaded.LoadedModel:
  """Reads `spec`, writes it into the new or empty folder `to` as `fmt` (a bucket `to`: staged locally, uploaded
  once written). The format's name and a taken `to` are refused before any download or load, what the format can
  hold once, from its files (an EFML folder) or once it is read, `to` against the model's files once
  (`storage.check_output`; a bucket's in `staged_output`).
  Returns what was read. Raises ConvertError, files.UnsafeOutputError and the loaders' one-line errors."""
  if fmt not in WRITE_FORMATS:
    raise ConvertError(f"--format={fmt}: the formats written are {', '.join(WRITE_FORMATS)}")
  check_target(to)
  found = resolve.resolve_model(spec)
  if found.efml_dir is not None:  # its kind known from its files alone: refused before its pickles are read
    _refuse(fmt, spec, is_efml=True)
  model = loaded.load_model(found)
  if found.efml_dir is None:
    _refuse(fmt, spec, efml_export.is_efml_variant(model.options))
  if not storage.is_remote(to):  # a bucket's `to` is checked where it is staged (`staged_output`)
    storage.check_output(to, "--to", inputs=model.input_files, directory=True, replaces=True)
  with storage.staged_output(to, "--to", directory=True, inputs=model.input_files) as local:
    write(model, local, fmt, spec)
  return model
