"""The released ELMo models by name, any model by folder or URL, and a one-call load into Flax.

    options_file, weight_file = pretrained.resolve("original")   # downloads once, then works offline
    elmo, variables = pretrained.load_elmo("small", dropout=0.5, l2_coef=1e-3)
    tx = pretrained.freeze_bilm(optax.adamw(1e-3))                # the biLM's params never move

Names are AllenNLP's published options.json + weights.hdf5 pairs (allennlp.org/elmo; `$ELMO_JAX_MODELS_URL`
points at a mirror with the same layout). No sha256 is
published for them, so the cache records the hash of the first download and checks it on every later
use; every download and every use must also be a valid options.json and a readable HDF5 file
(`cached_path(kind=...)`), so a server's error reply is never cached (see `elmo_jax.download`).
"""
from __future__ import annotations

import dataclasses
import glob
import os
import urllib.parse
from typing import Any, Sequence


from elmo_jax import download
from elmo_jax import options as options_lib
from elmo_jax import weights as weights_lib

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


def _pair_in_folder(folder: str) -> tuple[str, str]:
  """(options, weights) of a local folder: a training run's export/, or `options.json` + `weights.hdf5`,
  else the one `*options*.json` and the one `*weights*.hdf5` (or only `*.hdf5`) there."""
  if os.path.isdir(os.path.join(folder, "export")):
    folder = os.path.join(folder, "export")
  found = []
  for patterns in (("options.json", "*options*.json"), ("weights.hdf5", "*weights*.hdf5", "*.hdf5")):
    for pattern in patterns:
      matches = sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))
      if len(matches) == 1:
        found.append(matches[0])
        break
    else:
      raise download.DownloadError(f"{folder}: expected one {patterns[-1]} there, found {len(matches)}")
  return found[0], found[1]


def resolve(name_or_path: str) -> tuple[str, str]:
  """Local (options.json, weights.hdf5) for a released name, a local folder, or a URL.

  A URL names either a folder (ending in `/`: `options.json` and `weights.hdf5` inside) or the options
  file, whose weights sit beside it with `options.json` -> `weights.hdf5` (AllenNLP's naming).
  """
  if name_or_path in MODELS:
    m = MODELS[name_or_path]
    return (download.cached_path(m.options_url, m.options_sha256, kind="options"),
            download.cached_path(m.weight_url, m.weights_sha256, kind="hdf5"))
  if download.is_url(name_or_path):
    parsed = urllib.parse.urlparse(name_or_path)
    if parsed.scheme == "file" and os.path.isdir(download.cached_path(name_or_path)):
      return _pair_in_folder(download.cached_path(name_or_path))
    if name_or_path.endswith("/"):
      pair = (name_or_path + "options.json", name_or_path + "weights.hdf5")
    elif parsed.path.endswith("options.json"):
      pair = (name_or_path, name_or_path[:name_or_path.rindex("options.json")] + "weights.hdf5"
              + name_or_path[name_or_path.rindex("options.json") + len("options.json"):])
    else:
      raise download.DownloadError(f"{name_or_path}: give the URL of an options.json or of a folder "
                                   "(ending in /) holding options.json and weights.hdf5")
    return download.cached_path(pair[0], kind="options"), download.cached_path(pair[1], kind="hdf5")
  path = os.path.expanduser(name_or_path)
  if os.path.isdir(path):
    return _pair_in_folder(path)
  raise download.DownloadError(f"{name_or_path}: not a released model ({', '.join(MODELS)}), a folder or "
                               "a URL")


def is_model_spec(text: str) -> bool:
  """True for what `resolve` takes beyond a plain file: a released name or a URL."""
  return text in MODELS or download.is_url(text)


def load(name_or_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """(options, biLM params as numpy) of a released name, folder or URL."""
  options_file, weight_file = resolve(name_or_path)
  options = options_lib.load(options_file)
  return options, weights_lib.load_hdf5(weight_file, options)["params"]


def load_elmo(name_or_path: str, *, vocab_to_cache: Sequence[str] | None = None, **elmo_kwargs):
  """(`Elmo` module, ready `variables`) of a released name, folder or URL, in one call.

  `elmo_kwargs` go to `Elmo` (num_output_representations, dropout, do_layer_norm, l2_coef, ...). With
  `vocab_to_cache` the variables hold the char-CNN table of those words ("token_cache").
  """
  from elmo_jax.model import BiLMConfig, Elmo, elmo_variables  # pylint: disable=g-import-not-at-top
  options, params = load(name_or_path)
  if vocab_to_cache is not None:
    vocab_to_cache = tuple(vocab_to_cache)
  elmo = Elmo(BiLMConfig.from_options(options), vocab_to_cache=vocab_to_cache, **elmo_kwargs)
  return elmo, elmo_variables(elmo, params)


def _is_bilm(path: Sequence[Any]) -> bool:
  return any(getattr(k, "key", getattr(k, "name", None)) == "bilm" for k in path)


def bilm_labels(params: Any) -> Any:
  """"frozen" for every param under a `bilm` module (at any depth), "trainable" for the rest."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map_with_path(lambda p, _: "frozen" if _is_bilm(p) else "trainable", params)


def freeze_bilm(tx):
  """`tx` for everything but the biLM, whose updates are exactly zero (`optax.set_to_zero`).

  Unlike `stop_gradient` alone (`Elmo(requires_grad=False)`), this also keeps AdamW's weight decay and
  momentum from moving the "frozen" weights.
  """
  import optax  # pylint: disable=g-import-not-at-top
  return optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, bilm_labels)


__all__ = ["MODELS", "Released", "resolve", "load", "load_elmo", "freeze_bilm", "bilm_labels", "is_model_spec"]
