"""Models the interop tests build from bilm-tf's fixture."""
from __future__ import annotations

import os
import shutil

import numpy as np

from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS


def write_run_like(folder: str | os.PathLike) -> str:
  """bilm-tf's fixture with a softmax (5 words, seeded) and its vocabulary, as a run exports it, into `folder`
  (made if missing); returns its path."""
  os.makedirs(folder, exist_ok=True)
  options = options_lib.load(FIXTURE_OPTIONS)
  params = weights_lib.load_hdf5(FIXTURE_WEIGHTS, options)["params"]
  rng = np.random.default_rng(0)
  softmax = {"W": rng.standard_normal((5, 16)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
  weights_lib.save_hdf5(os.path.join(folder, "weights.hdf5"), params, options, softmax=softmax)
  options_lib.save(options, os.path.join(folder, "options.json"))
  with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
    f.write("<S>\n</S>\n<UNK>\nthe\nbank\n")
  return os.fspath(folder)


def write_fixture_folder(folder: str | os.PathLike) -> str:
  """bilm-tf's fixture as a model folder (options.json + weights.hdf5, what `--model=FOLDER` takes) in
  `folder` (made if missing); returns its path."""
  os.makedirs(folder, exist_ok=True)
  shutil.copy(FIXTURE_OPTIONS, os.path.join(folder, "options.json"))
  shutil.copy(FIXTURE_WEIGHTS, os.path.join(folder, "weights.hdf5"))
  return os.fspath(folder)


def write_safetensors_twin(pair: str | os.PathLike, folder: str | os.PathLike) -> str:
  """The model of `pair` (a `write_run_like` folder: softmax and vocabulary included) as elmo_jax's safetensors
  folder in `folder` (made if missing); returns its path."""
  from elmo_jax.formats import model_folder  # pylint: disable=g-import-not-at-top
  from elmo_jax.sources import loaded, resolve  # pylint: disable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  model = loaded.load_model(resolve.resolve_model(os.fspath(pair)))
  model_folder.write(os.fspath(folder), model.options, model.params, softmax=model.softmax,
                     vocab_file=model.vocab_file)
  return os.fspath(folder)
