"""Conversion: any model `resolve_model` finds, written in bilm-tf's layout where that layout can hold it.

    convert.convert("elmo_3/", "elmo_3_bilm/")        # a TF-Hub module -> options.json + weights.hdf5, exact
    convert.convert("runs/default", "shared/model/")   # a run's export (+ its vocab.txt and softmax), same bits

The one writable format is bilm-tf's (`FORMATS`): options.json + weights.hdf5 (`weights.save_hdf5`, the exact
writer; the softmax too where the source has one) + vocab.txt where the source has one (a run's, or one beside
the weights). Read back, every tensor has the bits it was read with. An ELMoForManyLangs model is refused: its
word embedding has no place there.
The output folder is built beside `to` and renamed onto it (`files.atomic_dir`); a `to` that holds files, or
holds or is one of the source's files, is refused first (`storage.check_output`), so a refusal writes nothing.
"""
from __future__ import annotations

import os
import shutil

from elmo_jax.interop import loaded
from elmo_jax.interop import options as options_lib
from elmo_jax.interop import pretrained
from elmo_jax.interop import weights as weights_lib
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE

FORMATS = ("bilm-hdf5",)


class ConvertError(ValueError):
  """A conversion that cannot be done; one line, nothing written."""


def load(spec: str) -> loaded.LoadedModel:
  """A model spec (`resolve_model`: a released name, a run, a folder, a TF-Hub module, a URL), read by
  `loaded.load_model`; an ELMoForManyLangs folder is refused (ConvertError, one line) before it is read."""
  found = pretrained.resolve_model(spec)
  if found.efml_dir is not None:
    raise ConvertError(
        f"{spec}: an ELMoForManyLangs model cannot be held in bilm-tf's layout (options.json + weights.hdf5 has "
        "no place for its word embedding, word.dic's vectors beside the char CNN); use the folder as it is "
        f"(--model={spec}), or a biLM trained here: a run's export/ (training/export) is bilm-tf's layout")
  return loaded.load_model(found)


def check_target(to: str, inputs: tuple[str, ...] = ()) -> None:
  """Refuses (one line) an output folder that holds files already, or holds or is one of `inputs`."""
  storage.check_output(to, "--to", inputs=inputs, directory=True, replaces=True)
  if storage.is_remote(to):
    taken = [name for name in (OPTIONS_FILE, WEIGHTS_FILE) if storage.exists(storage.join(to, name))]
  else:
    taken = sorted(os.listdir(to)) if os.path.isdir(to) else []
  if taken:
    raise files.UnsafeOutputError(f"--to={to} already holds {', '.join(taken[:3])}; give a new or empty folder")


def _check_format(fmt: str) -> None:
  if fmt not in FORMATS:
    raise ConvertError(f"--format={fmt}: the formats written are {', '.join(FORMATS)}")


def write(model: loaded.LoadedModel, folder: str, fmt: str = "bilm-hdf5") -> None:
  """Writes `model` into `folder` (replaced whole, atomically) in format `fmt`."""
  _check_format(fmt)
  with files.atomic_dir(folder) as tmp:
    options_lib.save(model.options, os.path.join(tmp, OPTIONS_FILE))
    weights_lib.save_hdf5(os.path.join(tmp, WEIGHTS_FILE), model.params, model.options, softmax=model.softmax)
    if model.vocab_file is not None:
      shutil.copyfile(model.vocab_file, os.path.join(tmp, VOCAB_FILE))


def convert(spec: str, to: str, fmt: str = "bilm-hdf5") -> loaded.LoadedModel:
  """Reads `spec`, checks `to`, writes it there (a bucket `to`: staged locally, uploaded once written).
  Returns what was read. Raises ConvertError, files.UnsafeOutputError and the loaders' one-line errors."""
  _check_format(fmt)
  check_target(to)  # before loading (a download): a taken folder costs nothing
  model = load(spec)
  check_target(to, model.input_files)
  with storage.staged_output(to, "--to", directory=True, inputs=model.input_files) as local:
    write(model, local, fmt)
  return model
