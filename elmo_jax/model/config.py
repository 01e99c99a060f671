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
  # ELMoForManyLangs' variant (formats/efml.py); the defaults are bilm-tf's.
  n_characters: int = 262  # rows of the char id space, the zero "no token" row included
  n_words: int = 0  # > 0: a word embedding [n_words, word_dim] concatenated before the projection; a token's
  word_dim: int = 0  # ids then carry its word id (+1) in column 0, before the char ids (`token_width`)
  highway: str = "bilm-tf"  # "allennlp": the gate keeps the input, g * x + (1 - g) * relu(.)
  implicit_forget_bias: bool = True  # TF's +1 on the forget gate (lstm.FORGET_BIAS); AllenNLP's cell has none
  special_ids: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # the <S> and </S> tokens' ids, where
  # they are not bilm-tf's (`chars.token_to_ids`)

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
        # bilm-tf's options say 261 or 262 and mean 262 (options.validate); a char vocabulary (EFML) says its size
        n_characters=int(cnn["char_vocab_size"]) + 1 if "char_vocab_size" in cnn else 262,
        n_words=int(cnn.get("word_embedding", {}).get("n_words", 0)),
        word_dim=int(cnn.get("word_embedding", {}).get("dim", 0)),
        highway=cnn.get("highway", "bilm-tf"),
        implicit_forget_bias=bool(lstm.get("implicit_forget_bias", True)),
        special_ids=(tuple(tuple(int(i) for i in row) for row in cnn["special_ids"])
                     if cnn.get("special_ids") else None),
    )

  @property
  def token_width(self) -> int:
    """Ids per token: `max_characters_per_token` char ids, after the word id where there is a word embedding."""
    return self.max_characters_per_token + (1 if self.n_words else 0)

  @property
  def output_dim(self) -> int:
    return 2 * self.projection_dim
