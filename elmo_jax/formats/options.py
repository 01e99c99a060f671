"""ELMo model options: the `options.json` schema of bilm-tf/AllenNLP and the released presets."""
from __future__ import annotations

import copy
import json
import os
from typing import Any

from elmo_jax.runtime import files

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
  _check_types(options, source)
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


def _is_int(v: Any, low: int) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _check_types(options: dict[str, Any], source: str) -> None:
  """Every key the model reads has the type it needs (a "256" string would build a garbage model)."""
  cnn, lstm = options["char_cnn"], options["lstm"]
  if not isinstance(cnn, dict) or not isinstance(lstm, dict):
    raise OptionsError(f"{source}: 'char_cnn' and 'lstm' must be objects")
  bad = lambda key, value, want: OptionsError(  # noqa: E731
      f"{source}: {key} must be {want}, got {value!r} ({type(value).__name__})")
  for key, low in (("dim", 1), ("n_layers", 1), ("projection_dim", 1)):
    if not _is_int(lstm[key], low):
      raise bad(f"lstm.{key}", lstm[key], f"an integer >= {low}")
  for key in ("cell_clip", "proj_clip"):
    value = lstm.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
      raise bad(f"lstm.{key}", value, "a number or null")
  if not isinstance(lstm.get("use_skip_connections", False), bool):
    raise bad("lstm.use_skip_connections", lstm["use_skip_connections"], "true or false")
  emb = cnn["embedding"]
  if not isinstance(emb, dict) or not _is_int(emb.get("dim"), 1):
    raise bad("char_cnn.embedding.dim", emb.get("dim") if isinstance(emb, dict) else emb, "an integer >= 1")
  if not _is_int(cnn["max_characters_per_token"], 3):
    raise bad("char_cnn.max_characters_per_token", cnn["max_characters_per_token"], "an integer >= 3")
  if not _is_int(cnn.get("n_highway") or 0, 0):
    raise bad("char_cnn.n_highway", cnn["n_highway"], "an integer >= 0")
  filters = cnn["filters"]
  if (not isinstance(filters, (list, tuple)) or not filters
      or not all(isinstance(f, (list, tuple)) and len(f) == 2 and all(_is_int(x, 1) for x in f) for f in filters)):
    raise bad("char_cnn.filters", filters, "a non-empty list of [width, count] integer pairs")


def load(path: str | os.PathLike) -> dict[str, Any]:
  if os.path.isdir(path):
    raise OptionsError(f"{path}: is a directory, not an options.json file")
  try:
    with open(path, encoding="utf-8") as f:
      options = json.load(f)
  except FileNotFoundError:
    raise OptionsError(f"{path}: options file not found") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    kind = files.looks_like(path)
    if kind == "an HDF5 file":
      raise OptionsError(f"{path}: is an HDF5 file, not options.json (options and weight files swapped?)") from None
    if isinstance(e, UnicodeDecodeError):
      raise OptionsError(f"{path}: is {kind}, not an options.json file") from None
    raise OptionsError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
  if not isinstance(options, dict):
    raise OptionsError(f"{path}: holds a JSON {type(options).__name__}, not an options object")
  return validate(options, str(path))


def save(options: dict[str, Any], path: str | os.PathLike) -> None:
  files.write_json(path, options)


def n_filters(options: dict[str, Any]) -> int:
  return sum(n for _, n in options["char_cnn"]["filters"])
