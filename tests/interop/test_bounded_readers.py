"""Model files are data from outside, bounded like tensors: an options field out of range is refused in one line
by `options.validate` whichever format holds it (options.json, a safetensors folder's config.json, an EFML
architecture, a TF-Hub module's shapes); JSON too deep or too large is refused before Python's parser recurses
(`runtime/json_bounded`); an npz's members are checked for what they inflate to before any is read; NaN weights
are refused wherever weights are read. No weights are built: every refusal comes first."""
from __future__ import annotations

import copy
import json
import os
import struct
import zipfile

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import efml_util
import tiny
from elmo_jax.data import chars
from elmo_jax.formats import checks
from elmo_jax.formats import efml
from elmo_jax.formats import model_folder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import safetensors
from elmo_jax.formats import stablehlo
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import json_bounded
from elmo_jax.sources import loaded
from elmo_jax.sources import pretrained

_DEEP = "[" * 5000 + "]" * 5000


def _one_line(e: pytest.ExceptionInfo) -> str:
  message = str(e.value)
  assert "\n" not in message and len(message) < 400, message
  return message


def test_every_released_shape_fits_the_limits():
  for name in options_lib.PRESETS:  # small, medium, original (original_5.5B has the original's shape)
    options_lib.validate(options_lib.preset(name), name)
  arch = efml_util.ARCHITECTURE["token_embedder"]
  assert arch["max_characters_per_token"] <= options_lib.LIMITS["char_cnn.max_characters_per_token"]
  tiny.tiny_options()


@pytest.mark.parametrize("key, value, words", [
    ("char_cnn.max_characters_per_token", 1_000_000, "max_characters_per_token is 1,000,000, over the 1,024"),
    ("char_cnn.filters", [[1, 32], [2, 10**9]], "char_cnn.filters.count"),
    ("char_cnn.filters", [[80, 32]], "char_cnn.filters.width"),
    ("char_cnn.filters", [[9, 32]] * 2 + [[60, 4]], "over char_cnn.max_characters_per_token"),
    ("char_cnn.embedding.dim", 10**7, "char_cnn.embedding.dim"),
    ("char_cnn.n_highway", 1000, "char_cnn.n_highway"),
    ("lstm.dim", 10**6, "lstm.dim"),
    ("lstm.n_layers", 500, "lstm.n_layers"),
    ("lstm.projection_dim", 10**6, "lstm.projection_dim"),
    ("lstm.cell_clip", float("nan"), "lstm.cell_clip"),
    ("n_tokens_vocab", 10**10, "n_tokens_vocab"),
    ("n_tokens_vocab", "793471", "n_tokens_vocab must be an integer"),
])
def test_an_options_json_out_of_range_is_one_line(tmp_path, key, value, words):
  options = options_lib.preset("small")
  *parents, leaf = key.split(".")
  node = options
  for p in parents:
    node = node[p]
  node[leaf] = value
  path = tmp_path / "options.json"
  path.write_text(json.dumps(options))
  with pytest.raises(options_lib.OptionsError) as e:
    options_lib.load(path)
  assert words in _one_line(e) and str(path) in str(e.value)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(k for k in options_lib.LIMITS if "filters" not in k)),
       st.integers(0, 2**40))
def test_a_size_is_accepted_exactly_within_its_limit(key, value):
  options = options_lib.preset("small")
  *parents, leaf = key.split(".")
  node = options
  for p in parents:
    node = node.setdefault(p, {})
  node[leaf] = value
  minimum = 1 if key in ("lstm.dim", "lstm.n_layers", "lstm.projection_dim", "char_cnn.embedding.dim") else 0
  # the widest released filter is 7 wide: max_characters_per_token must hold it
  minimum = 7 if key == "char_cnn.max_characters_per_token" else minimum
  try:
    options_lib.validate(options, "options")
    accepted = True
  except options_lib.OptionsError:
    accepted = False
  assert accepted == (minimum <= value <= options_lib.LIMITS[key]), (key, value)


def _folder_config(tmp_path, options) -> str:
  folder = tmp_path / "st"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps({"format": model_folder.FORMAT, "format_version": 1,
                                                  "variant": "bilm-tf", "options": options}))
  return str(folder)


def test_a_safetensors_config_json_out_of_range_is_one_line(tmp_path):
  options = options_lib.preset("small")
  options["char_cnn"]["max_characters_per_token"] = 1_000_000
  with pytest.raises(model_folder.FolderError) as e:
    model_folder.read_config(_folder_config(tmp_path, options))
  assert "max_characters_per_token" in _one_line(e) and "config.json" in str(e.value)


def _efml_folder(tmp_path, arch) -> str:
  folder = tmp_path / "efml"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps({"config_path": "arch.json"}))
  (folder / "arch.json").write_text(arch if isinstance(arch, str) else json.dumps(arch))
  for name, vocab in (("char.dic", efml_util.CHARS), ("word.dic", efml_util.WORDS)):
    (folder / name).write_text("".join(f"{c}\t{i}\n" for i, c in enumerate(vocab)), encoding="utf-8")
  for name in ("encoder.pkl", "token_embedder.pkl"):
    (folder / name).write_bytes(b"never read: the options are refused first")
  return str(folder)


def test_an_efml_architecture_out_of_range_is_one_line(tmp_path):
  arch = copy.deepcopy(efml_util.ARCHITECTURE)
  arch["token_embedder"]["max_characters_per_token"] = 1_000_000
  with pytest.raises(ValueError) as e:
    efml.load(_efml_folder(tmp_path, arch))
  assert "max_characters_per_token is 1,000,000" in _one_line(e)


def test_a_tfhub_module_with_a_filter_wider_than_a_token_is_one_line():
  shapes = {"bilm/char_embed": (262, 16), "bilm/CNN/W_cnn_0": (1, 200, 16, 32),
            "bilm/RNN_0/RNN/MultiRNNCell/Cell0/rnn/lstm_cell/bias": (4096,)}
  tensors = {k: np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}
  with pytest.raises(options_lib.OptionsError) as e:
    tfhub._options(tensors, "module/variables/variables.index")  # pylint: disable=protected-access
  assert "char_cnn.filters.width" in _one_line(e)


def test_the_char_id_cache_is_bounded_in_bytes():
  cache = chars.CharIdCache(options_lib.LIMITS["char_cnn.max_characters_per_token"], max_size=10**6)
  cache.many([f"t{i}" for i in range(cache.max_size + 50)])
  held = sum(v.nbytes for v in cache._cache.values())  # pylint: disable=protected-access
  assert len(cache._cache) == cache.max_size and held <= chars.MAX_CACHE_BYTES  # pylint: disable=protected-access


@settings(max_examples=80, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(alphabet="[]{}\"\\ab"),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text("[]{}\"ab", max_size=3),
                                                                                 inner, max_size=3), max_leaves=20))
def test_the_depth_scan_counts_what_the_parser_nests(value):
  def nesting(v) -> int:
    if isinstance(v, list):
      return 1 + max(map(nesting, v), default=0)
    if isinstance(v, dict):
      return 1 + max(map(nesting, v.values()), default=0)
    return 0
  text = json.dumps(value)
  assert json_bounded.depth(text) == nesting(value)
  assert json_bounded.loads(text) == value


def test_deep_json_is_one_line_in_every_reader(tmp_path):
  (tmp_path / "options.json").write_text(_DEEP)
  with pytest.raises(options_lib.OptionsError) as e:
    options_lib.load(tmp_path / "options.json")
  assert "nested deeper than 64" in _one_line(e)
  assert "nested deeper" in checks.check_kind(str(tmp_path / "options.json"), kind="options")

  folder = tmp_path / "st"
  folder.mkdir()
  (folder / "config.json").write_text(_DEEP)
  with pytest.raises(model_folder.FolderError) as e:
    model_folder.read_config(str(folder))
  assert "nested deeper" in _one_line(e)

  raw = ('{"a": ' + "[" * 3000 + "]" * 3000 + "}").encode()
  (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
  with pytest.raises(safetensors.SafetensorsError) as e:
    safetensors.read_header(tmp_path / "model.safetensors")
  assert "nested deeper" in _one_line(e)

  with pytest.raises(efml.EFMLError) as e:
    efml.load(_efml_folder(tmp_path, _DEEP))
  assert "nested deeper" in _one_line(e)


def _exported(shapes: dict[str, tuple[int, ...]]) -> jax.export.Exported:
  spec = {k: jax.ShapeDtypeStruct(s, np.float32) for k, s in shapes.items()}
  return jax.export.export(jax.jit(lambda w, x: {"y": x * sum(v.sum() for v in w.values())}))(
      spec, jax.ShapeDtypeStruct((2,), np.float32))


def test_an_npz_is_checked_for_what_it_inflates_to_before_it_is_read(tmp_path):
  exported = _exported({"w": (4, 4)})
  path = str(tmp_path / "weights.npz")
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    with z.open("w.npy", "w", force_zip64=True) as f:  # a small file of 64 MiB of zeros
      block = bytes(1 << 20)
      for _ in range(64):
        f.write(block)
  assert os.path.getsize(path) < 1 << 20
  with pytest.raises(stablehlo.ExportedError) as e:
    stablehlo._weights(path, exported)  # pylint: disable=protected-access
  assert "inflates to 67,108,864 bytes" in _one_line(e)

  (tmp_path / "weights.npz").write_bytes(b"PK\x03\x04 not a zip at all")
  with pytest.raises(stablehlo.ExportedError) as e:
    stablehlo._weights(path, exported)  # pylint: disable=protected-access
  assert "not a readable .npz" in _one_line(e)

  np.savez(path, w=np.full((4, 4), np.nan, np.float32))
  with pytest.raises(stablehlo.ExportedError) as e:
    stablehlo._weights(path, exported)  # pylint: disable=protected-access
  assert "NaN or infinite" in _one_line(e)
  np.savez(path, w=np.ones((4, 4), np.float32))
  assert stablehlo._weights(path, exported)["w"].sum() == 16  # pylint: disable=protected-access


def test_nan_weights_are_refused_by_the_one_load(tmp_path, fixture_options):
  from paths import FIXTURE_WEIGHTS  # pylint: disable=g-import-not-at-top
  import h5py  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  weights = tmp_path / "weights.hdf5"
  shutil.copyfile(FIXTURE_WEIGHTS, weights)
  (tmp_path / "options.json").write_text(json.dumps(fixture_options))
  with h5py.File(weights, "r+") as f:
    name = []
    f.visititems(lambda n, obj: name.append(n) if isinstance(obj, h5py.Dataset) and obj.dtype.kind == "f"
                 and obj.size > 1 else None)
    data = f[name[0]][...]
    data.flat[0] = np.inf
    f[name[0]][...] = data
  with pytest.raises(weights_lib.WeightFileError) as e:
    loaded.load_model(pretrained.resolve_model(str(tmp_path)))
  assert "non-finite" in _one_line(e) and str(weights) in str(e.value)


def test_nan_weights_of_any_format_are_refused_by_the_one_load(monkeypatch, fixture_options, fixture_params):
  """An EFML folder's torch files, a module's mix: whatever a format's reader checks, `load_model` checks all."""
  params = jax.tree_util.tree_map(np.array, fixture_params)
  params["char_cnn"]["char_embed"][3, 1] = np.nan
  model = loaded.LoadedModel(fixture_options, params, loaded.EFML, ("efml/config.json", "efml/encoder.pkl"))
  monkeypatch.setattr(loaded, "_read", lambda found: model)
  with pytest.raises(weights_lib.WeightFileError) as e:
    loaded.load_model(None)
  assert "efml/config.json: the weight bilm/char_cnn/char_embed holds NaN" in _one_line(e)
  mix = {"weights": np.array([0.5, np.inf, 0.5], np.float32), "scaling": np.float32(1)}
  model = loaded.LoadedModel(fixture_options, fixture_params, loaded.TFHUB, ("m/variables.index",), mix=mix)
  monkeypatch.setattr(loaded, "_read", lambda found: model)
  with pytest.raises(weights_lib.WeightFileError) as e:
    loaded.load_model(None)
  assert "mix/weights" in _one_line(e)


@pytest.mark.parametrize("error", [MemoryError("cannot allocate 4.0 TiB"), zipfile.BadZipFile("File is not a zip")])
def test_a_readers_memory_or_zip_error_is_one_line_from_the_one_load(monkeypatch, error):
  def fail(found):
    raise error
  monkeypatch.setattr(loaded, "_read", fail)
  with pytest.raises(weights_lib.WeightFileError) as e:
    loaded.load_model(pretrained.ResolvedModel(path="model/"))
  assert _one_line(e).startswith("model/: reading it failed") and type(error).__name__ in str(e.value)


def test_a_commands_memory_error_is_one_line(capsys):
  from elmo_jax import cli  # pylint: disable=g-import-not-at-top

  def main(argv):
    raise MemoryError("cannot allocate")
  with pytest.raises(SystemExit) as e:
    cli._one_line_usage_errors(main, "elmo-jax embed", False)([])  # pylint: disable=protected-access
  assert e.value.code == 1
  assert capsys.readouterr().err.strip().startswith("elmo-jax embed: error: out of memory (cannot allocate)")
