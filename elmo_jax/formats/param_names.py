"""Flat tensor names of nested params: the Flax param path joined by "/" (`char_cnn/W_cnn_0`,
`lstm/forward_layer_0/W_0`, ...), as the safetensors folder and the StableHLO artifact's weights store them.
numpy only: the artifact's loader imports nothing else of the library."""
from __future__ import annotations

from typing import Any

import numpy as np


def flat(params: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
  """Nested params -> {"prefix/a/b": float32 numpy} (no prefix: {"a/b": ...}), in sorted order."""
  out: dict[str, np.ndarray] = {}
  for key in sorted(params):
    value, name = params[key], f"{prefix}/{key}" if prefix else key
    if isinstance(value, dict):
      out.update(flat(value, name))
    else:
      out[name] = np.asarray(value, np.float32)
  return out


def nested(flat_tensors: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """`flat`'s inverse: the names under `prefix` (all of them without one) as nested dicts."""
  out: dict[str, Any] = {}
  for name, value in flat_tensors.items():
    if prefix:
      if not name.startswith(prefix + "/"):
        continue
      name = name[len(prefix) + 1:]
    *parents, leaf = name.split("/")
    node = out
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out
