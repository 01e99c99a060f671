"""elmo_jax's own model folder: config.json + model.safetensors (+ vocab.txt, char.dic, word.dic) + README.md.

    model_folder.write(tmp, options, params, softmax=..., mix=..., vocab_file=..., lexicon=..., card=text)
    folder = model_folder.load("elmo_small/")    # options, params, softmax, mix, token ids: no pickle, no hdf5

- `config.json`: {"format": "elmo_jax", "format_version": 1, "variant": "bilm-tf" | "elmoformanylangs",
  "options": options.json's content (the model's shape, checked by `options.validate`)}.
- `model.safetensors` (`formats/safetensors.py`), float32, one tensor per parameter, named by its Flax path
  joined by "/": `bilm/char_cnn/char_embed`, `bilm/char_cnn/W_cnn_0`, `bilm/char_cnn/CNN_high_0/W_carry`,
  `bilm/char_cnn/CNN_proj/W_proj`, `bilm/char_cnn/word_embed` (an EFML model's word vectors),
  `bilm/lstm/forward_layer_0/{W_0,B,W_P_0}`, ... (`BiLM`'s params as `load_elmo` takes them, under "bilm");
  where the model has them, the LM's softmax `softmax/W` [vocab, P], `softmax/b` [vocab] and a TF-Hub module's
  learned mix `mix/weights` [n_layers + 1], `mix/scaling` []. Every name the options give must be there with its
  shape, nothing else may be, every value finite (`weights.checked`).
- `vocab.txt`: the softmax's words, where it has one; `char.dic` / `word.dic`: an ELMoForManyLangs-style
  model's lexicons (its char ids are `chars.LexiconIds`, not bilm-tf's bytes).
- `README.md`: the model card (`card`): what it is, where it came from, how it was checked, how to load it.

Nothing is unpickled or opened with h5py: the header is read and checked before a tensor byte is.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from typing import Any

import jax
import numpy as np

from elmo_jax.data import chars
from elmo_jax.data import lexicon as lexicon_lib
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import param_names
from elmo_jax.formats import safetensors
from elmo_jax.formats import weights as weights_lib
from elmo_jax.model import make_model
from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded
from elmo_jax.runtime.run_layout import VOCAB_FILE

FORMAT, VERSION = "elmo_jax", 1
CONFIG, WEIGHTS, CARD = "config.json", "model.safetensors", "README.md"
BILM_TF, EFML = "bilm-tf", "elmoformanylangs"
MAX_CONFIG = 1 << 20  # bytes of config.json read (the options are a few hundred)


class FolderError(weights_lib.WeightFileError):
  """A model folder that is not a valid one; one line naming the file (and tensor or key)."""


@dataclasses.dataclass(frozen=True)
class Folder:
  """A model folder read into memory (float32 numpy); see the module docstring for each part."""
  options: dict[str, Any]
  params: dict[str, Any]
  variant: str
  files: tuple[str, ...]           # config.json, model.safetensors, then the lexicons and vocab.txt read
  softmax: dict[str, np.ndarray] | None = None
  mix: dict[str, np.ndarray] | None = None
  token_ids: chars.LexiconIds | None = None
  vocab_file: str | None = None


def is_folder(path: str | os.PathLike) -> bool:
  """A folder holding config.json and model.safetensors (what `write` makes; `load` says if it is valid)."""
  path = os.fspath(path)
  return all(os.path.isfile(os.path.join(path, n)) for n in (CONFIG, WEIGHTS))


def variant_of(options: dict[str, Any]) -> str:
  """EFML's model shape (a char lexicon) or bilm-tf's (byte char ids)."""
  return EFML if "char_vocab_size" in options["char_cnn"] else BILM_TF


def param_shapes(options: dict[str, Any]) -> dict[str, tuple[int, ...]]:
  """{"bilm/<flax path>": shape} of every `BiLM` parameter of validated `options` (traced, nothing run)."""
  return dict(_param_shapes(json.dumps(options, sort_keys=True)))


@functools.lru_cache(maxsize=16)  # a trace costs ~0.1 s; a process loads few shapes, often again
def _param_shapes(options_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
  model = make_model(json.loads(options_json))
  # Abstract inputs, a raw uint32 key among them: traced only, nothing is compiled or put on a device (a load
  # under a tight memory limit, or before any device is wanted, stays cheap).
  key = jax.ShapeDtypeStruct((2,), np.uint32)
  shapes = jax.eval_shape(model.init, key, jax.ShapeDtypeStruct((1, 1, model.config.token_width), np.int32))["params"]
  return tuple(("bilm/" + "/".join(k.key for k in path), tuple(leaf.shape))
               for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0])


def write(folder: str, options: dict[str, Any], params: dict[str, Any], *, softmax: dict[str, Any] | None = None,
          mix: dict[str, Any] | None = None, vocab_file: str | None = None,
          lexicon: lexicon_lib.Lexicon | None = None, card: str = "") -> None:
  """Writes the folder's files into `folder` (existing and empty: the caller's `files.atomic_dir`)."""
  options = options_lib.validate(options, "options")
  variant = variant_of(options)
  if variant == EFML and lexicon is None:
    raise FolderError(f"{folder}: an ELMoForManyLangs-style model needs its char.dic / word.dic to be written")
  tensors = param_names.flat(params, "bilm")
  if set(tensors) != set(param_shapes(options)):
    raise FolderError(f"{folder}: the params do not match the options (tensors {sorted(set(tensors))[:3]}...)")
  for part, name in ((softmax, "softmax"), (mix, "mix")):
    tensors.update(param_names.flat(part, name) if part else {})
  files.write_json(os.path.join(folder, CONFIG), {"format": FORMAT, "format_version": VERSION, "variant": variant,
                                                   "options": options})
  safetensors.save(os.path.join(folder, WEIGHTS), tensors, {"format": FORMAT})
  if vocab_file is not None:
    shutil.copyfile(vocab_file, os.path.join(folder, VOCAB_FILE))
  if variant == EFML:
    lexicon.save(folder)
  if card:
    files.write_text(os.path.join(folder, CARD), card)


def run_card(workdir: str, options: dict[str, Any]) -> str:
  """The card of a training run's export: what it is and how to load it (nothing converted, nothing to check)."""
  lstm = options["lstm"]
  return (f"---\nlibrary_name: elmo_jax\ntags: [elmo, jax, flax, safetensors]\n---\n# ELMo biLM trained by elmo_jax\n\n"
          f"Exported by the training run `{workdir}`: {lstm['n_layers']} LSTM layers of {lstm['dim']} cells "
          f"projected to {lstm['projection_dim']}, in elmo_jax's own format (`config.json`, `model.safetensors`).\n\n"
          "Load it with `Embedder.from_pretrained(\"THIS_FOLDER\")` or "
          "`elmo-jax embed --model=THIS_FOLDER --input_file=in.txt --output_file=out.hdf5`.\n")


def read_config(folder: str) -> tuple[dict[str, Any], str]:
  """(validated options, variant) of a folder's config.json; FolderError, one line naming it."""
  path = os.path.join(folder, CONFIG)
  if os.path.getsize(path) > MAX_CONFIG:
    raise FolderError(f"{path}: {os.path.getsize(path):,} bytes, over the {MAX_CONFIG:,} a config.json may be")
  try:
    config = json_bounded.load(path, max_bytes=MAX_CONFIG)
  except (UnicodeDecodeError, ValueError) as e:
    raise FolderError(f"{path}: not a readable JSON file ({' '.join(str(e).split())[:80]})") from None
  if not isinstance(config, dict) or config.get("format") != FORMAT:
    raise FolderError(f"{path}: not an elmo_jax model folder's config.json (no \"format\": \"{FORMAT}\")")
  version = config.get("format_version")
  if type(version) is not int or not 1 <= version <= VERSION:  # noqa: E721
    raise FolderError(f"{path}: format_version {version!r:.20} is not one this elmo_jax reads (1 to {VERSION}); "
                      "a newer elmo_jax wrote it?")
  if not isinstance(config.get("options"), dict):
    raise FolderError(f"{path}: holds no \"options\" object")
  try:
    options = options_lib.validate(config["options"], f"{path}: options")
  except ValueError as e:
    raise FolderError(str(e)) from None
  if config.get("variant") != variant_of(options):
    raise FolderError(f"{path}: variant {config.get('variant')!r:.40} does not match its options "
                      f"({variant_of(options)})")
  return options, config["variant"]


def _optional(tensors: dict[str, np.ndarray], prefix: str, shapes: dict[str, tuple], where: str):
  """The `prefix/` tensors of `shapes` ({leaf: shape}), checked, nested; None if none is there."""
  if not any(f"{prefix}/{leaf}" in tensors for leaf in shapes):
    return None
  return {leaf: _checked(tensors, f"{prefix}/{leaf}", shape, where) for leaf, shape in shapes.items()}


def _checked(tensors: dict[str, np.ndarray], name: str, shape: tuple, where: str) -> np.ndarray:
  if name not in tensors:
    raise FolderError(f"{where}: tensor '{name}' is missing (the options expect shape {shape})")
  return weights_lib.checked(tensors[name], shape, f"{where}: tensor '{name}'", "the options expect")


def check_tensors(tensors: dict[str, np.ndarray], options: dict[str, Any], where: str):
  """(params, softmax or None, mix or None) from a file's tensors: every name of the options there with its
  shape and nothing unknown, floats, finite (`weights.checked`); FolderError, one line naming the tensor."""
  expected = param_shapes(options)
  vocab = tensors["softmax/b"].shape[0] if "softmax/b" in tensors and tensors["softmax/b"].ndim == 1 else 0
  proj = options["lstm"]["projection_dim"]
  layers = options["lstm"]["n_layers"]
  optional = {"softmax": {"W": (vocab, proj), "b": (vocab,)}, "mix": {"weights": (layers + 1,), "scaling": ()}}
  known = set(expected) | {f"{prefix}/{leaf}" for prefix, part in optional.items() for leaf in part}
  unknown = sorted(set(tensors) - known)
  if unknown:
    raise FolderError(f"{where}: holds tensor '{unknown[0][:80]}', which is no parameter of the model its "
                      f"options give ({len(unknown)} unknown)")
  try:
    flat_params = {name: _checked(tensors, name, shape, where) for name, shape in expected.items()}
    return (param_names.nested(flat_params, "bilm"),
            *(_optional(tensors, p, part, where) for p, part in optional.items()))
  except weights_lib.WeightFileError as e:
    raise FolderError(str(e)) from None


def load(folder: str | os.PathLike) -> Folder:
  """Reads a model folder (see the module docstring); FolderError / SafetensorsError, one line naming the file."""
  folder = os.fspath(folder)
  options, variant = read_config(folder)
  weights_file = os.path.join(folder, WEIGHTS)
  tensors, _ = safetensors.load(weights_file)
  params, softmax, mix = check_tensors(tensors, options, weights_file)
  read = [os.path.join(folder, CONFIG), weights_file]
  token_ids = None
  if variant == EFML:
    cnn = options["char_cnn"]
    words = bool(cnn.get("word_embedding", {}).get("dim"))
    try:
      lex = lexicon_lib.read(folder, int(cnn["max_characters_per_token"]), words)
    except lexicon_lib.LexiconError as e:
      raise FolderError(str(e)) from None
    if lex.option_values() != {"char_vocab_size": cnn["char_vocab_size"], "special_ids": cnn.get("special_ids"),
                               "n_words": cnn.get("word_embedding", {}).get("n_words", 0)}:
      raise FolderError(f"{folder}: char.dic / word.dic do not match config.json's options (their sizes or the "
                        "boundary tokens' ids differ)")
    token_ids = lex.ids()
    read += [os.path.join(folder, n) for n in (lexicon_lib.CHAR_DIC, lexicon_lib.WORD_DIC)[:1 + words]]
  vocab = os.path.join(folder, VOCAB_FILE)
  vocab = vocab if os.path.isfile(vocab) else None
  return Folder(options, params, variant, tuple(read), softmax, mix, token_ids, vocab)
