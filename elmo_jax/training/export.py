"""Exports a trained biLM in the original layout: `export/{options.json,weights.hdf5,vocab.txt}`."""
from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import numpy as np

from elmo_jax.runtime import files
from elmo_jax.interop import options as options_lib
from elmo_jax.interop import weights as weights_lib
from elmo_jax.runtime.run_layout import EXPORT_DIR, OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE


def export_model(workdir: str, params: dict[str, Any], options: dict[str, Any]) -> str:
  """Writes options.json + weights.hdf5 (with the softmax) + vocab.txt atomically; returns the folder.

  The folder is built beside the old one and swapped in, so a reader never sees a mix of two exports.
  """
  final = os.path.join(workdir, EXPORT_DIR)
  host = jax.tree_util.tree_map(lambda x: np.asarray(jax.device_get(x), np.float32), params)
  with files.atomic_dir(final) as tmp:
    options_lib.save(options, os.path.join(tmp, OPTIONS_FILE))
    weights_lib.save_hdf5(os.path.join(tmp, WEIGHTS_FILE), host["bilm"], options, softmax=host["softmax"])
    vocab = os.path.join(workdir, VOCAB_FILE)
    if os.path.exists(vocab):
      shutil.copyfile(vocab, os.path.join(tmp, VOCAB_FILE))
  return final
