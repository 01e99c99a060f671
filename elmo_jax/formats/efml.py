"""ELMoForManyLangs (HIT-SCIR, 44 languages) model folders -> our options, `BiLM` params and token ids, exactly.

    options, params, token_ids = efml.load("zhs.model")     # config.json, char.dic, word.dic, *.pkl
    emb = Embedder.from_pretrained("zhs.model")             # the same, through pretrained.resolve_model

A folder holds `config.json` (whose `config_path` names the architecture JSON, often missing from the
download: then the published default `cnn_50_100_512_4096_sample` shape is used, as elmoformanylangs does,
and one line says so), `char.dic` and `word.dic` (`chars.read_dic`), and the PyTorch state dicts
`token_embedder.pkl` and `encoder.pkl` (read without torch, `torch_pickle`). The model differences are options
of our modules (`BiLMConfig`): Unicode code points through char.dic (`chars.LexiconIds`), the word embedding
before the projection, AllenNLP's highway and LSTM cell without TF's implicit forget bias, skip connections
on every layer but the first. AllenNLP's gate order (i, f, g, o) is permuted into TF's (i, j, f, o) here:
a permutation, so the numbers are the same bits. Nothing is written back (EFML has no bilm-tf hdf5 form: its
word embedding has no place there).
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from elmo_jax.data import chars
from elmo_jax.formats import checks
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import torch_pickle
from elmo_jax.formats import weights as weights_lib
from elmo_jax.formats.weights import WeightFileError
from elmo_jax.runtime import files
from elmo_jax.runtime import json_bounded
from elmo_jax.runtime import log
from elmo_jax.runtime import outside_names

FORMAT = "elmoformanylangs"
CONFIG, CHAR_DIC, WORD_DIC, ENCODER, TOKEN_EMBEDDER = (
    "config.json", "char.dic", "word.dic", "encoder.pkl", "token_embedder.pkl")
DEFAULT_ARCHITECTURE = "cnn_50_100_512_4096_sample"
# elmoformanylangs/configs/cnn_50_100_512_4096_sample.json (the package's cnn_0_100_... is the same JSON).
_DEFAULT = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu",
                       "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                       "n_highway": 2, "word_dim": 100, "char_dim": 50, "max_characters_per_token": 50},
}
# EFML's output_layer -> `embedding.args.select_layers`: -1 the average of the layers, -2 all, k layer k.
OUTPUT_LAYERS = {-1: "average", -2: "all", 0: 0, 1: 1, 2: 2}


class EFMLError(WeightFileError):
  """An ELMoForManyLangs folder that cannot be loaded; one line naming the file (and key or line)."""


def is_efml_dir(path: str | os.PathLike) -> bool:
  """True for a folder laid out as an ELMoForManyLangs model (config.json, encoder.pkl, token_embedder.pkl)."""
  path = os.fspath(path)
  return os.path.isdir(path) and all(os.path.isfile(os.path.join(path, n)) for n in (CONFIG, ENCODER, TOKEN_EMBEDDER))


def folder_problem(path: str | os.PathLike) -> str | None:
  """Why a folder that holds ELMoForManyLangs files (two or more of its five names) is not one it can load
  ('encoder.pkl is missing', 'config.json is a directory'), in one line naming the folder; None for a complete
  folder or one that holds no EFML files (another format's, then)."""
  path = os.fspath(path)
  names = (CONFIG, CHAR_DIC, WORD_DIC, ENCODER, TOKEN_EMBEDDER)
  present = [n for n in names if os.path.lexists(os.path.join(path, n))]
  if not os.path.isdir(path) or len(present) < 2 or (is_efml_dir(path) and CHAR_DIC in present):
    return None
  missing = [n for n in (CONFIG, CHAR_DIC, ENCODER, TOKEN_EMBEDDER) if n not in present]
  not_files = [n for n in present if not os.path.isfile(os.path.join(path, n))]
  what = "; ".join([f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"] * bool(missing) +
                   [f"{n} is {files.looks_like(os.path.join(path, n))}, not a file" for n in not_files])
  return (f"{path}: an ELMoForManyLangs model folder (it has {', '.join(present)}), but {what}; it needs "
          f"{CONFIG}, {CHAR_DIC}, {ENCODER} and {TOKEN_EMBEDDER} (and {WORD_DIC} with a word embedding)")


def model_files(folder: str) -> dict[str, str]:
  """{name: path} of the folder's files that a load reads (what an output must not overwrite)."""
  return {n: os.path.join(folder, n) for n in (CONFIG, CHAR_DIC, WORD_DIC, ENCODER, TOKEN_EMBEDDER)
          if os.path.exists(os.path.join(folder, n))}


def _blobs(folder: str) -> str | None:
  """The blobs/ of a Hugging Face cache snapshot (`models--owner--name/snapshots/<commit>/`, what an `hf://`
  spec reads): its files are links into it by design; None for any other folder."""
  parent = os.path.dirname(os.path.abspath(folder))
  return os.path.join(os.path.dirname(parent), "blobs") if os.path.basename(parent) == "snapshots" else None


def architecture_names(folder: str) -> list[str]:
  """The names (relative to `folder`, `/`-separated) where `architecture` looks for the architecture JSON that
  config.json's `config_path` names: as named, then by file name, each only if it stays in the folder; [] for a
  config.json that names none or cannot be read (its load says why). What a download of the folder fetches."""
  try:
    named = json_bounded.load(os.path.join(folder, CONFIG)).get("config_path")
  except (OSError, ValueError, AttributeError):
    return []
  if not isinstance(named, str):
    return []
  out = []
  for name in (named, named.replace("\\", "/").rsplit("/", 1)[-1]):
    try:
      out.append("/".join(outside_names.name_parts(name)))
    except outside_names.OutsideNameError:
      pass
  return list(dict.fromkeys(out))


def architecture(folder: str) -> dict[str, Any]:
  """The architecture JSON that config.json's `config_path` names, looked for where elmoformanylangs looks
  (beside config.json's path, then by file name in the folder) but never outside the folder
  (`outside_names.inside`: releases name `../configs/X.json`); missing: the published default."""
  config_file = os.path.join(folder, CONFIG)
  try:
    config = json_bounded.load(config_file)
  except (OSError, ValueError) as e:
    raise EFMLError(f"{config_file}: not a readable JSON file ({checks.one_line(e)})") from None
  named = config.get("config_path") if isinstance(config, dict) else None
  if not isinstance(named, str):
    raise EFMLError(f"{config_file}: has no 'config_path' (the architecture JSON's name)")
  candidates = []
  for name in (named, named.replace("\\", "/").rsplit("/", 1)[-1]):
    try:
      candidates.append(outside_names.inside(folder, name, f"{config_file}: config_path", links_into=_blobs(folder)))
    except outside_names.OutsideNameError as e:
      if name != named:
        raise EFMLError(str(e)) from None
  for path in candidates:
    if os.path.isfile(path):
      try:
        return json_bounded.load(path)
      except (OSError, ValueError) as e:
        raise EFMLError(f"{path}: not a readable architecture JSON ({checks.one_line(e)})") from None
  log.info(f"{config_file}: its architecture {named} is not in {folder}; using the published default "
           f"{DEFAULT_ARCHITECTURE} shape (as elmoformanylangs does)")
  return json.loads(json.dumps(_DEFAULT))


def _sections(arch: Any, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
  """(token_embedder, encoder) of an architecture JSON, each key the load reads checked: one line naming the
  file and the key for a JSON that is not an object, lacks a key, or holds a value of the wrong kind."""
  if not isinstance(arch, dict):
    raise EFMLError(f"{where}: the architecture is a JSON {type(arch).__name__}, not an object with "
                    "'token_embedder' and 'encoder'")
  out = []
  for section, keys in (("token_embedder", ("char_dim", "max_characters_per_token", "filters")),
                        ("encoder", ("dim", "n_layers", "projection_dim"))):
    value = arch.get(section, {})
    if not isinstance(value, dict):
      raise EFMLError(f"{where}: '{section}' is a JSON {type(value).__name__}, not an object")
    for key in keys + ("word_dim", "n_highway"):
      v = value.get(key)
      if v is None and key in ("word_dim", "n_highway"):
        continue
      if key == "filters":
        ok = isinstance(v, list) and v and all(isinstance(f, list) and len(f) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in f) for f in v)
        if not ok:
          raise EFMLError(f"{where}: '{section}.filters' is {json.dumps(v)[:60]}, not a list of [width, count] "
                          "pairs of positive integers")
      elif v is None:
        raise EFMLError(f"{where}: '{section}' has no '{key}'")
      elif isinstance(v, bool) or not isinstance(v, int) or v < (0 if key in ("word_dim", "n_highway") else 1):
        raise EFMLError(f"{where}: '{section}.{key}' is {json.dumps(v)[:40]}, not a positive integer")
    out.append(value)
  return out[0], out[1]


def load(folder: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any], chars.LexiconIds]:
  """(options, `BiLM` params as float32 numpy, token ids) of an ELMoForManyLangs folder; EFMLError, one line."""
  folder = os.fspath(folder)
  emb, enc = _sections(architecture(folder), f"{folder}: architecture")
  where = f"{folder}: architecture"
  if str(emb.get("name", "cnn")).lower() != "cnn" or str(enc.get("name", "elmo")).lower() != "elmo":
    raise EFMLError(f"{where} token_embedder.name={emb.get('name')!r}, encoder.name={enc.get('name')!r}: only "
                    "the 'cnn' token embedder with the 'elmo' encoder (every released model) is supported")
  char2id = _dic(folder, CHAR_DIC)
  word2id = _dic(folder, WORD_DIC) if emb.get("word_dim") else None
  try:
    token_ids = chars.LexiconIds(char2id, word2id, int(emb["max_characters_per_token"]))
  except (ValueError, KeyError) as e:
    raise EFMLError(f"{folder}/{e.args[0] if isinstance(e, ValueError) else 'architecture: missing ' + str(e)}") from None
  options = options_lib.validate({
      "char_cnn": {"activation": emb.get("activation", "relu"), "embedding": {"dim": int(emb["char_dim"])},
                   "filters": emb["filters"], "n_highway": int(emb.get("n_highway") or 0),
                   "max_characters_per_token": int(emb["max_characters_per_token"]),
                   "char_vocab_size": len(char2id), "highway": "allennlp",
                   "word_embedding": {"n_words": len(word2id or ()), "dim": int(emb.get("word_dim") or 0)},
                   "special_ids": [list(row) for row in token_ids.special]},
      "lstm": {"dim": int(enc["dim"]), "n_layers": int(enc["n_layers"]), "projection_dim": int(enc["projection_dim"]),
               "cell_clip": enc.get("cell_clip"), "proj_clip": enc.get("proj_clip"),
               "use_skip_connections": True, "implicit_forget_bias": False},
      "format": FORMAT}, f"{folder}/{CONFIG}")
  te = _state(folder, TOKEN_EMBEDDER)  # after the options are checked: their sizes bound what is read
  params = {"char_cnn": _char_cnn(te, options, folder, char2id, word2id),
            "lstm": _lstm(_state(folder, ENCODER), options, folder)}
  return options, params, token_ids


def _dic(folder: str, name: str) -> dict[str, int]:
  """A dictionary's {token: id}, its ids 0..n-1 (the rows of its embedding table): one line naming the file
  and line for anything else (`chars.read_dic`: not UTF-8, not 'token<TAB>id', a negative id)."""
  path = os.path.join(folder, name)
  if not os.path.isfile(path):
    raise EFMLError(f"{path}: not found (an ELMoForManyLangs model has {CHAR_DIC} and {WORD_DIC})")
  try:
    out = chars.read_dic(path)
  except ValueError as e:
    raise EFMLError(str(e)) from None
  if not out:
    raise EFMLError(f"{path}: holds no entries")
  ids = set(out.values())
  gap = next((i for i in range(len(ids)) if i not in ids), None)
  if gap is not None:
    raise EFMLError(f"{path}: its ids skip {gap} (ids run to {max(ids)} over {len(out)} entries); an "
                    "ELMoForManyLangs dictionary numbers its entries 0..n-1")
  return out


def _state(folder: str, name: str) -> dict[str, np.ndarray]:
  path = os.path.join(folder, name)
  try:
    state = torch_pickle.load(path)
  except torch_pickle.TorchPickleError as e:
    raise EFMLError(str(e)) from None
  if not isinstance(state, dict):
    raise EFMLError(f"{path}: holds a {type(state).__name__}, not a state dict")
  return {k: v for k, v in state.items() if isinstance(v, np.ndarray)}


def _take(state: dict[str, np.ndarray], key: str, shape: tuple[int, ...], path: str) -> np.ndarray:
  if key not in state:
    raise EFMLError(f"{path}: has no '{key}' (expected shape {shape})")
  try:  # the check every loaded parameter passes: floats, of the shape, finite
    return weights_lib.checked(state[key], shape, f"{path}: '{key}'", "the architecture expects")
  except WeightFileError as e:
    raise EFMLError(str(e)) from None


def _vocab_rows(state, key: str, vocab: dict[str, int], dim: int, path: str, dic: str) -> np.ndarray:
  """An embedding table whose rows must be the dic's ids (EFML sizes it `len(dic)`)."""
  rows = state[key].shape[0] if key in state else len(vocab)
  top = max(vocab.values())
  if rows != len(vocab) or top >= rows or min(vocab.values()) < 0:
    raise EFMLError(f"{dic}: {len(vocab):,} entries (ids up to {top:,}), but {path}'s '{key}' has {rows:,} rows")
  return _take(state, key, (rows, dim), path)


def _char_cnn(te, options, folder, char2id, word2id) -> dict[str, Any]:
  cnn = options["char_cnn"]
  path, dim = os.path.join(folder, TOKEN_EMBEDDER), cnn["embedding"]["dim"]
  out: dict[str, Any] = {"char_embed": _vocab_rows(te, "char_emb_layer.embedding.weight", char2id, dim, path,
                                                   os.path.join(folder, CHAR_DIC))}
  for i, (width, num) in enumerate(cnn["filters"]):  # torch Conv1d [out, in, width] -> ours [width, in, out]
    out[f"W_cnn_{i}"] = _take(te, f"convolutions.{i}.weight", (num, dim, width), path).transpose(2, 1, 0)
    out[f"b_cnn_{i}"] = _take(te, f"convolutions.{i}.bias", (num,), path)
  d = options_lib.n_filters(options)
  for k in range(cnn["n_highway"]):  # one Linear(d, 2d): the transform's rows, then the gate's
    w = _take(te, f"highways._layers.{k}.weight", (2 * d, d), path)
    b = _take(te, f"highways._layers.{k}.bias", (2 * d,), path)
    out[f"CNN_high_{k}"] = {"W_transform": w[:d].T.copy(), "b_transform": b[:d].copy(),
                            "W_carry": w[d:].T.copy(), "b_carry": b[d:].copy()}
  words = cnn["word_embedding"]
  if words["n_words"]:
    out["word_embed"] = _vocab_rows(te, "word_emb_layer.embedding.weight", word2id, words["dim"], path,
                                    os.path.join(folder, WORD_DIC))
  proj = options["lstm"]["projection_dim"]
  out["CNN_proj"] = {"W_proj": _take(te, "projection.weight", (proj, words["dim"] + d), path).T.copy(),
                     "b_proj": _take(te, "projection.bias", (proj,), path)}
  return out


def _lstm(enc, options, folder) -> dict[str, Any]:
  lstm = options["lstm"]
  path, cell, proj = os.path.join(folder, ENCODER), lstm["dim"], lstm["projection_dim"]
  # AllenNLP's gate blocks (input, forget, memory, output) -> TF's (input, memory j, forget, output)
  order = np.concatenate([np.arange(cell) + g * cell for g in (0, 2, 1, 3)])
  out = {}
  for direction in ("forward", "backward"):
    for k in range(lstm["n_layers"]):
      name = f"{direction}_layer_{k}"
      w_x = _take(enc, f"{name}.input_linearity.weight", (4 * cell, proj), path)
      w_h = _take(enc, f"{name}.state_linearity.weight", (4 * cell, proj), path)
      bias = _take(enc, f"{name}.state_linearity.bias", (4 * cell,), path)
      w_p = _take(enc, f"{name}.state_projection.weight", (proj, cell), path)
      out[name] = {"W_0": np.concatenate([w_x, w_h], 1)[order].T.copy(), "B": bias[order].copy(),
                   "W_P_0": w_p.T.copy()}
  return out
