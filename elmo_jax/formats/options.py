"""ELMo model options: the `options.json` schema of bilm-tf/AllenNLP and the released presets."""
from __future__ import annotations

import copy
import json
import math
import os
from typing import Any

from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded

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


# What an options file may say, inclusive: every released model (bilm-tf's small/medium/original/original_5.5B,
# TF-Hub elmo/3, ELMoForManyLangs) fits well inside. No tensor depends on `max_characters_per_token` (a 10**6
# makes the char-id cache build a 4 MB row per token) and shapes are products of the rest: an options file is
# data from outside, bounded like a tensor before anything is built from it.
LIMITS: dict[str, int] = {
    "lstm.dim": 16_384,  # released: 4096
    "lstm.projection_dim": 8_192,  # 512
    "lstm.n_layers": 16,  # 2
    "char_cnn.embedding.dim": 1_024,  # 16 (EFML: 50)
    "char_cnn.max_characters_per_token": 1_024,  # 50
    "char_cnn.n_highway": 16,  # 1 or 2
    "char_cnn.filters": 64,  # [width, count] pairs; 7
    "char_cnn.filters.width": 64,  # 7 (and at most max_characters_per_token)
    "char_cnn.filters.count": 16_384,  # 1024
    "char_cnn.n_filters": 65_536,  # the counts' sum: 2048
    "char_cnn.char_vocab_size": 2_000_000,  # EFML's char.dic: Unicode has 1,114,112 code points
    "char_cnn.word_embedding.n_words": 20_000_000,  # EFML's word.dic
    "char_cnn.word_embedding.dim": 4_096,  # EFML: 100
    "n_tokens_vocab": 20_000_000,  # bilm-tf's softmax vocabulary: 793,471
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
  _check_bounds(options, source)
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


def _check_bounds(options: dict[str, Any], source: str) -> None:
  """Every size the model or the char ids are built from within `LIMITS` (types checked first)."""
  cnn, lstm = options["char_cnn"], options["lstm"]
  words = cnn.get("word_embedding") if isinstance(cnn.get("word_embedding"), dict) else {}
  sizes = {"lstm.dim": lstm["dim"], "lstm.projection_dim": lstm["projection_dim"], "lstm.n_layers": lstm["n_layers"],
           "char_cnn.embedding.dim": cnn["embedding"]["dim"],
           "char_cnn.max_characters_per_token": cnn["max_characters_per_token"],
           "char_cnn.n_highway": cnn.get("n_highway") or 0, "char_cnn.filters": len(cnn["filters"]),
           "char_cnn.filters.width": max(w for w, _ in cnn["filters"]),
           "char_cnn.filters.count": max(n for _, n in cnn["filters"]),
           "char_cnn.n_filters": sum(n for _, n in cnn["filters"]),
           "char_cnn.char_vocab_size": cnn.get("char_vocab_size", 0),
           "char_cnn.word_embedding.n_words": words.get("n_words", 0),
           "char_cnn.word_embedding.dim": words.get("dim", 0), "n_tokens_vocab": options.get("n_tokens_vocab", 0)}
  for key, value in sizes.items():
    if value is not None and not _is_int(value, 0):
      raise OptionsError(f"{source}: {key} must be an integer >= 0, got {value!r:.40} ({type(value).__name__})")
    if value is not None and value > LIMITS[key]:
      raise OptionsError(f"{source}: {key} is {value:,}, over the {LIMITS[key]:,} this reader accepts (every "
                         "released ELMo is far below it)")
  if sizes["char_cnn.filters.width"] > cnn["max_characters_per_token"]:
    raise OptionsError(f"{source}: char_cnn.filters has a width {sizes['char_cnn.filters.width']} over "
                       f"char_cnn.max_characters_per_token ({cnn['max_characters_per_token']})")
  for key in ("cell_clip", "proj_clip"):
    value = lstm.get(key)
    if value is not None and not (math.isfinite(value) and value >= 0):
      raise OptionsError(f"{source}: lstm.{key} must be a finite number >= 0 or null, got {value!r}")


def load(path: str | os.PathLike) -> dict[str, Any]:
  if os.path.isdir(path):
    raise OptionsError(f"{path}: is a directory, not an options.json file")
  try:
    options = json_bounded.load(path, str(path))
  except FileNotFoundError:
    raise OptionsError(f"{path}: options file not found") from None
  except json_bounded.JSONLimitError as e:
    raise OptionsError(str(e)) from None
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
