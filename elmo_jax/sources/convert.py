"""Conversion: any model `resolve_model` finds, written in bilm-tf's layout where that layout can hold it.

    convert.convert("elmo_3/", "elmo_3_bilm/")        # a TF-Hub module -> options.json + weights.hdf5, exact
    convert.convert("runs/default", "shared/model/")   # a run's export (+ its vocab.txt and softmax), same bits

Five formats are written (`FORMATS`): bilm-tf's options.json + weights.hdf5 (`weights.save_hdf5`, the exact
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
from elmo_jax.sources.resolve import ResolvedModel

FORMATS = ("bilm-hdf5", "efml", "safetensors", "stablehlo", "onnx")
EFML, SAFETENSORS, STABLEHLO, ONNX = "efml", "safetensors", "stablehlo", "onnx"


class ConvertError(ValueError):
  """A conversion that cannot be done; one line, nothing written."""


def format_problem(options: dict[str, Any], fmt: str) -> str | None:
  """Why a model of these options cannot be written as `fmt` (one line), else None."""
  if fmt not in FORMATS:
    return f"the formats written are {', '.join(FORMATS)}"
  is_efml = efml_export.is_efml_variant(options)
  if fmt == "bilm-hdf5" and is_efml:
    return ("an ELMoForManyLangs-shaped model cannot be held in bilm-tf's layout (options.json + weights.hdf5 has "
            "no place for its word embedding, word.dic's vectors beside the char CNN, nor its char.dic); write "
            "it as efml")
  if fmt == EFML and not is_efml:
    return ("a bilm-tf-shaped model (byte char ids, TF's cell) cannot be held in an ELMoForManyLangs folder "
            "(char.dic code points, AllenNLP's cell); write it as bilm-hdf5")
  return None


def load(spec: str) -> loaded.LoadedModel:
  """A model spec (`resolve_model`: a released name, a run, a folder, a TF-Hub module, a URL, an EFML folder),
  read by `loaded.load_model`."""
  return loaded.load_model(resolve.resolve_model(spec))


def check_target(to: str, inputs: tuple[str, ...] = ()) -> None:
  """Refuses (one line) an output folder that holds files already, or holds or is one of `inputs`."""
  storage.check_output(to, "--to", inputs=inputs, directory=True, replaces=True)
  if storage.is_remote(to):
    taken = [name for name in (OPTIONS_FILE, WEIGHTS_FILE) if storage.exists(storage.join(to, name))]
  else:
    taken = sorted(os.listdir(to)) if os.path.isdir(to) else []
  if taken:
    raise files.UnsafeOutputError(f"--to={to} already holds {', '.join(taken[:3])}; give a new or empty folder")


def _check_format(fmt: str, model: loaded.LoadedModel | None = None, spec: str = "") -> None:
  if fmt not in FORMATS:
    raise ConvertError(f"--format={fmt}: the formats written are {', '.join(FORMATS)}")
  problem = None if model is None else format_problem(model.options, fmt)
  if problem:
    raise ConvertError(f"--format={fmt}: {spec + ': ' if spec else ''}{problem}")


def write(model: loaded.LoadedModel, folder: str, fmt: str = "bilm-hdf5", spec: str = "") -> None:
  """Writes `model` into `folder` (replaced whole, atomically) in format `fmt` (`spec`: what it was read from,
  for a safetensors folder's card)."""
  _check_format(fmt, model)
  if fmt == SAFETENSORS:
    write_folder(model, folder, spec)
    return
  if fmt in (STABLEHLO, ONNX):  # any model: the forward pass with its weights (formats/stablehlo, onnx_export)
    with files.atomic_dir(folder) as tmp:
      if fmt == STABLEHLO:
        stablehlo.write(tmp, model.options, model.params)
      else:
        onnx_export.write(tmp, model.options, model.params, model.token_ids)
    return
  if fmt == EFML:
    if model.token_ids is None:
      raise ConvertError("--format=efml: the model has no char.dic / word.dic to write")
    folder_in = model.source.efml_dir if model.source is not None else None
    with files.atomic_dir(folder) as tmp:
      efml_export.write(tmp, model.options, model.params, model.token_ids.char2id, model.token_ids.word2id,
                        arch_name=efml_export.arch_name_of(folder_in) if folder_in else None)
    return
  weights = sum(np.asarray(a).nbytes for a in jax.tree_util.tree_leaves([model.params, model.softmax or {}]))
  weights += weights // 100 + (1 << 20)  # HDF5's headers: well under 1% and a MiB
  vocab = os.path.getsize(model.vocab_file) if model.vocab_file is not None else 0
  files.check_room(folder, weights + vocab + (1 << 16), weights, "--to")
  with files.atomic_dir(folder) as tmp:
    options_lib.save(model.options, os.path.join(tmp, OPTIONS_FILE))
    weights_lib.save_hdf5(os.path.join(tmp, WEIGHTS_FILE), model.params, model.options, softmax=model.softmax)
    if model.vocab_file is not None:
      shutil.copyfile(model.vocab_file, os.path.join(tmp, VOCAB_FILE))


def write_folder(model: loaded.LoadedModel, folder: str, spec: str) -> None:
  """Writes `model` as elmo_jax's own folder (`model_folder`), read back and run against `model` on the card's
  sentences (`card.max_difference`); a difference refuses the folder (ConvertError), none (0.0) is recorded in
  the card (README.md)."""
  ids = model.token_ids
  lexicon = None if ids is None else lexicon_lib.Lexicon(ids.char2id, ids.word2id, ids.max_chars)
  with files.atomic_dir(folder) as tmp:
    model_folder.write(tmp, model.options, model.params, softmax=model.softmax, mix=model.mix,
                       vocab_file=model.vocab_file, lexicon=lexicon)
    diff = card.max_difference(model, loaded.load_model(ResolvedModel(path=tmp, folder_dir=tmp)))
    if diff != 0.0:
      raise ConvertError(f"--to={folder}: the written folder's layers differ from the source's by {diff:.3g}; "
                         "nothing written")
    files.write_text(os.path.join(tmp, model_folder.CARD), card.text(spec, model, diff))


def convert(spec: str, to: str, fmt: str = "bilm-hdf5") -> loaded.LoadedModel:
  """Reads `spec`, checks `to`, writes it there (a bucket `to`: staged locally, uploaded once written).
  Returns what was read. Raises ConvertError, files.UnsafeOutputError and the loaders' one-line errors."""
  _check_format(fmt)
  check_target(to)  # before loading (a download): a taken folder costs nothing
  found = resolve.resolve_model(spec)  # a folder, URL or archive as local files; no weights read yet
  if fmt == "bilm-hdf5" and found.efml_dir is not None:
    raise ConvertError(
        f"{spec}: an ELMoForManyLangs model cannot be held in bilm-tf's layout (options.json + weights.hdf5 has "
        "no place for its word embedding, word.dic's vectors beside the char CNN); write it as an EFML folder "
        f"(--format=efml), use the folder as it is (--model={spec}), or a biLM trained here: a run's export/")
  model = loaded.load_model(found)
  _check_format(fmt, model, spec)
  check_target(to, model.input_files)
  with storage.staged_output(to, "--to", directory=True, inputs=model.input_files) as local:
    write(model, local, fmt, spec)
  return model
