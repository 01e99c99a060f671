"""The released ELMo models by name: AllenNLP's published options.json + weights.hdf5 pairs (allennlp.org/elmo;
`$ELMO_JAX_MODELS_URL` points at a mirror with the same layout), what `resolve.resolve_model` takes as a name.

No sha256 is published for them, so the cache records the hash of the first download and checks it on every later
use (see `elmo_jax.sources.download`).
"""
from __future__ import annotations

import dataclasses
import os

ALLENNLP_BASE = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"


def base_url() -> str:
  """Where the released files are: AllenNLP's bucket, or a mirror in `$ELMO_JAX_MODELS_URL` (same layout)."""
  return (os.environ.get("ELMO_JAX_MODELS_URL") or ALLENNLP_BASE).rstrip("/")


@dataclasses.dataclass(frozen=True)
class Released:
  """One published model: where its two files are and what they hold."""
  name: str
  key: str                       # AllenNLP's directory and file-name stem
  params_millions: float         # allennlp.org/elmo
  weights_mb: float              # size of weights.hdf5 (MB = 1e6 bytes)
  description: str
  options_sha256: str | None = None   # none published; recorded on first download
  weights_sha256: str | None = None

  @property
  def options_url(self) -> str:
    return f"{base_url()}/{self.key}/elmo_{self.key}_options.json"

  @property
  def weight_url(self) -> str:
    return f"{base_url()}/{self.key}/elmo_{self.key}_weights.hdf5"


# Sizes: `original` is 374,434,792 bytes as downloads report it; the others are the float32 parameter bytes
# plus the same ~31 kB of HDF5 overhead (the 5.5B model has the original's shape).
MODELS: dict[str, Released] = {m.name: m for m in (
    Released("small", "2x1024_128_2048cnn_1xhighway", 13.6, 54.4,
             "LSTM 1024, output 2x128, 1 highway; 1B Word Benchmark"),
    Released("medium", "2x2048_256_2048cnn_1xhighway", 28.0, 112.1,
             "LSTM 2048, output 2x256, 1 highway; 1B Word Benchmark"),
    Released("original", "2x4096_512_2048cnn_2xhighway", 93.6, 374.4,
             "LSTM 4096, output 2x512, 2 highway; 1B Word Benchmark (the paper's model)"),
    Released("original_5.5B", "2x4096_512_2048cnn_2xhighway_5.5B", 93.6, 374.4,
             "as original, trained on 5.5B tokens (Wikipedia + WMT news 2008-2012)"),
)}
