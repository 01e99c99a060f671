"""ELMo model options: the `options.json` schema of bilm-tf/AllenNLP and the released presets."""
from __future__ import annotations

import copy
import json
import os
from typing import Any

from elmo_jax import files

# The released ELMo sizes (allennlp.org/elmo). The char CNN is the same for all three.
_CHAR_CNN = {
    "activation": "relu",
    "embedding": {"dim": 16},
    "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
    "max_characters_per_token": 50,
    "n_characters": 262,
    "n_highway": 2,
}
PRESETS: dict[str, dict[str, Any]] = {
    # 2x1024_128_2048cnn_1xhighway
    "small": {
        "lstm": {"cell_clip": 3, "dim": 1024, "n_layers": 2, "proj_clip": 3,
                 "projection_dim": 128, "use_skip_connections": True},
        "char_cnn": {**_CHAR_CNN, "n_highway": 1},
    },
    # 2x2048_256_2048cnn_1xhighway
    "medium": {
        "lstm": {"cell_clip": 3, "dim": 2048, "n_layers": 2, "proj_clip": 3,
                 "projection_dim": 256, "use_skip_connections": True},
        "char_cnn": {**_CHAR_CNN, "n_highway": 1},
    },
    # 2x4096_512_2048cnn_2xhighway
    "original": {
        "lstm": {"cell_clip": 3, "dim": 4096, "n_layers": 2, "proj_clip": 3,
                 "projection_dim": 512, "use_skip_connections": True},
        "char_cnn": {**_CHAR_CNN, "n_highway": 2},
    },
}


class OptionsError(ValueError):
  """An options.json that cannot describe an ELMo model; the message names the file and key."""


def preset(name: str) -> dict[str, Any]:
  if name not in PRESETS:
    raise OptionsError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
  return copy.deepcopy(PRESETS[name])


def validate(options: dict[str, Any], source: str = "options") -> dict[str, Any]:
  """Checks the keys the model reads; returns a normalised deep copy."""
  options = copy.deepcopy(options)
  for section, keys in (("lstm", ("dim", "n_layers", "projection_dim")),
                        ("char_cnn", ("filters", "embedding", "max_characters_per_token"))):
    if section not in options:
      raise OptionsError(f"{source}: missing key '{section}'")
    for key in keys:
      if key not in options[section]:
        raise OptionsError(f"{source}: missing key '{section}.{key}'")
  cnn, lstm = options["char_cnn"], options["lstm"]
  if cnn.get("activation", "relu") not in ("relu", "tanh"):
    raise OptionsError(f"{source}: char_cnn.activation must be 'relu' or 'tanh', got {cnn['activation']!r}")
  if cnn.get("n_characters", 262) not in (261, 262):
    raise OptionsError(f"{source}: char_cnn.n_characters must be 261 or 262, got {cnn['n_characters']}")
  cnn.setdefault("activation", "relu")
  cnn.setdefault("n_highway", 0)
  cnn["n_characters"] = 262  # bilm-tf trains with 261 and infers with 262; we always use the +1 ids.
  lstm.setdefault("cell_clip", None)
  lstm.setdefault("proj_clip", None)
  lstm.setdefault("use_skip_connections", False)
  return options


def load(path: str | os.PathLike) -> dict[str, Any]:
  try:
    with open(path) as f:
      options = json.load(f)
  except FileNotFoundError:
    raise OptionsError(f"{path}: options file not found") from None
  except json.JSONDecodeError as e:
    raise OptionsError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
  return validate(options, str(path))


def save(options: dict[str, Any], path: str | os.PathLike) -> None:
  files.write_json(path, options)


def n_filters(options: dict[str, Any]) -> int:
  return sum(n for _, n in options["char_cnn"]["filters"])


def output_dim(options: dict[str, Any]) -> int:
  """Width of one ELMo layer: `2 * projection_dim`."""
  return 2 * options["lstm"]["projection_dim"]
