"""`BiLMConfig`: the model-shaping part of options.json, passed whole to every module of the biLM."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class BiLMConfig:
  """The model-shaping part of options.json, hashable so it can be a Flax module attribute."""
  filters: tuple[tuple[int, int], ...]
  char_dim: int
  n_highway: int
  activation: str
  max_characters_per_token: int
  lstm_dim: int
  projection_dim: int
  n_layers: int
  cell_clip: float | None
  proj_clip: float | None
  use_skip_connections: bool

  @classmethod
  def from_options(cls, options: dict[str, Any]) -> "BiLMConfig":
    cnn, lstm = options["char_cnn"], options["lstm"]
    return cls(
        filters=tuple((int(w), int(n)) for w, n in cnn["filters"]),
        char_dim=int(cnn["embedding"]["dim"]),
        n_highway=int(cnn.get("n_highway") or 0),
        activation=cnn.get("activation", "relu"),
        max_characters_per_token=int(cnn["max_characters_per_token"]),
        lstm_dim=int(lstm["dim"]),
        projection_dim=int(lstm["projection_dim"]),
        n_layers=int(lstm["n_layers"]),
        cell_clip=lstm.get("cell_clip"),
        proj_clip=lstm.get("proj_clip"),
        use_skip_connections=bool(lstm.get("use_skip_connections", False)),
    )

  @property
  def output_dim(self) -> int:
    return 2 * self.projection_dim
