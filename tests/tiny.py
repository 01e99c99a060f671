"""The one tiny model of the test suite: its options (model-core tests) and its trainer config (training,
fault, multi-host, perplexity and notebook tests, in process or written to a config file for train.py).

A plain module, not conftest.py: train.py subprocesses import it from their config file, and importing
conftest there would switch on the tests' compilation cache inside the child.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from elmo_jax.formats import options as options_lib
from paths import TESTS_DIR as TESTS

# The trainer's tiny biLM: LSTM 32 -> 8, a 16-filter char CNN over 4-dim char embeddings; 5-token windows.
TRAIN_MODEL = {"options.lstm.dim": 32, "options.lstm.projection_dim": 8,
               "options.char_cnn.filters": [[1, 8], [2, 8]], "options.char_cnn.embedding.dim": 4,
               "unroll_steps": 5}


def tiny_options(skip: bool = True, cell_clip=3.0, proj_clip=3.0, n_layers: int = 2) -> dict:
  """A tiny biLM: 16 filters projected to P=6, 2 highway layers, LSTM 8 units."""
  return options_lib.validate({
      "char_cnn": {"activation": "relu", "embedding": {"dim": 4}, "filters": [[1, 4], [2, 4], [3, 8]],
                   "max_characters_per_token": 50, "n_characters": 262, "n_highway": 2},
      "lstm": {"cell_clip": cell_clip, "dim": 8, "n_layers": n_layers, "proj_clip": proj_clip,
               "projection_dim": 6, "use_skip_connections": skip},
  })


def train_config(train_file: str, eval_file: str = "", **overrides: Any):
  """`base_config()` with the tiny model, whitespace-tokenized `train_file`, batch 4; then `overrides`
  (dotted keys allowed: `**{"options.char_cnn.n_highway": 1}`)."""
  from elmo_jax.training.config import base_config  # pylint: disable=g-import-not-at-top
  c = base_config()
  settings = {**TRAIN_MODEL, "batch_size": 4, "data.train_files": train_file, "data.eval_files": eval_file,
              "data.pretokenized": True, **overrides}
  for key, value in settings.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def write_train_config(path: str, train_file: str, eval_file: str = "", **overrides: Any) -> str:
  """`train_config(...)` as a config file for `train.py --config=path` (lists such as the char CNN's
  filters cannot be set by flags)."""
  with open(path, "w") as f:
    f.write(f"import sys\nsys.path.insert(0, {TESTS!r})\nimport tiny\n\n\n"
            f"def get_config():\n  return tiny.train_config({train_file!r}, {eval_file!r}, **{overrides!r})\n")
  return path


_WORDS = ("the bank of the river flooded . she sat on the river bank . the bank lent money . "
          "they plant trees near the plant . a power plant makes power . money is in the bank .").split(" . ")


def _lines(n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [f"{_WORDS[i]} ." for i in rng.integers(len(_WORDS), size=n)]


def train_tiny(workdir: str, steps: int = 10) -> str:
  """Trains a tiny biLM (LSTM 32, projection 8) on a synthetic corpus; returns the workdir."""
  from elmo_jax.training.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top

  data = os.path.join(workdir, "data")
  os.makedirs(data, exist_ok=True)
  for name, n, seed in (("train.txt", 200, 0), ("valid.txt", 30, 1)):
    with open(os.path.join(data, name), "w", encoding="utf-8") as f:
      f.write("\n".join(_lines(n, seed)) + "\n")
  c = train_config(os.path.join(data, "train.txt"), os.path.join(data, "valid.txt"), **{
      "num_train_steps": steps, "eval_every_steps": 5, "checkpoint_every_steps": steps, "log_every_steps": 5,
      "n_negative_samples": 0, "data.pretokenized": False})
  train_and_evaluate(c, workdir)
  return workdir
