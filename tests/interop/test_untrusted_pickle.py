"""A torch.save file is data with bounds (formats/torch_pickle.py): nothing a file does outlives its load, no
opcode acts on the allowed objects beyond what torch.save needs, allocation is bounded by the file (bombs
refused in one line, in a child under a memory limit), every view lies inside its storage, and every EFML
parameter is finite floats of the architecture's shape."""
from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

import torch_files as tf
from elmo_jax.formats import efml
from elmo_jax.formats import torch_pickle
from elmo_jax.formats import weights

LAYOUTS = {"legacy": tf.legacy, "zip": tf.zipped}


def _refused(path, match: str):
  with pytest.raises(torch_pickle.TorchPickleError) as e:
    torch_pickle.load(path)
  message = str(e.value)
  assert message.startswith(f"{path}: ") and "\n" not in message and len(message) < 400, message
  assert match in message, message
  return message


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_valid_file_reads_back(tmp_path, layout):
  arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.arange(5, dtype=np.int64),
            "h": np.float16([1.5, -2])}
  obj, data = tf.state(arrays)
  got = torch_pickle.load(LAYOUTS[layout](tmp_path / "ok.pkl", obj, data))
  assert list(got) == list(arrays)
  for k, a in arrays.items():
    assert got[k].dtype == a.dtype and np.array_equal(got[k], a)


def test_build_on_an_allowed_global_is_refused_and_changes_no_later_load(tmp_path):
  """BUILD on `torch.FloatStorage` (only allowed names) set the dtype every later file was read with."""
  poison = tf.legacy(tmp_path / "poison.pkl", tf.Reduce(tf.ORDERED_DICT), pickle_bytes=(
      b"\x80\x02ctorch\nFloatStorage\n}X\x05\x00\x00\x00dtypeX\x03\x00\x00\x00<i4sb."))
  _refused(poison, "BUILD of _StorageType")
  obj, data = tf.state({"w": np.float32([1.0, 2.0])})
  good = tf.legacy(tmp_path / "good.pkl", obj, data)
  assert torch_pickle.load(good)["w"].dtype == np.float32
  # An attribute set on a rebuild function, or a dunder on an OrderedDict: refused too.
  fn = tf.legacy(tmp_path / "fn.pkl", None,
                 pickle_bytes=b"\x80\x02ctorch._utils\n_rebuild_tensor\n}X\x01\x00\x00\x00aK\x01sb.")
  _refused(fn, "BUILD of function")
  dunder = tf.legacy(tmp_path / "d.pkl", None, pickle_bytes=b"\x80\x02ccollections\nOrderedDict\n)R}X\x09\x00\x00\x00"
                     b"__class__X\x01\x00\x00\x00asb.")
  _refused(dunder, "BUILD of OrderedDict")


@pytest.mark.parametrize("opcodes,what", [
    (b"\x80\x02ccollections\nOrderedDict\n)\x81.", "NEWOBJ"),
    (b"\x80\x02\x82\x01.", "EXT1"),
    (b"\x80\x04\x8f(\x90.", "EMPTY_SET"),
    (b"\x80\x02ctorch._utils\n_rebuild_tensor\n]R.", "REDUCE of"),
    (b"\x80\x02ctorch\nFloatStorage\n)R.", "REDUCE of"),
    (b"\x80\x02}(K\x01K\x02)K\x03u.", "a dict key that is not a string or number"),
])
def test_opcodes_a_state_dict_never_needs_are_refused(tmp_path, opcodes, what):
  _refused(tf.legacy(tmp_path / "x.pkl", None, pickle_bytes=opcodes), what)


def _shared_tree(depth: int) -> bytes:
  """A pickle of ~6 bytes a level: level k is [level k-1, level k-1] (2^depth leaves if expanded)."""
  out = [b"\x80\x02]q\x00"]
  for k in range(depth):  # POP the level below (it stays in the memo), build this one from it twice
    out.append(b"0](h%sh%se" % (bytes([k]), bytes([k])) + b"q" + bytes([k + 1]))
  return b"".join(out) + b"."


def _cases(tmp_path) -> list[tuple[str, str]]:
  """The bombs and out-of-storage views, each a small file."""
  one = {"0": np.float32([7.0])}
  big = {"0": np.zeros(4, np.float32)}
  cases = [
      ("shared-list tree", tf.legacy(tmp_path / "tree.pkl", None, pickle_bytes=b"\x80\x02}X\x01\x00\x00\x00w" +
                                     _shared_tree(120)[2:-1] + b"s.")),
      ("memo index 2^30", tf.legacy(tmp_path / "memo.pkl", None, pickle_bytes=b"\x80\x02]r\x00\x00\x00\x40h\x00.")),
      ("memo index 2^30, zip", tf.zipped(tmp_path / "memo.zip", None,
                                         pickle_bytes=b"\x80\x02]r\x00\x00\x00\x40h\x00.")),
  ]
  stride0 = {"w": tf.tensor(tf.Storage("0", numel=1), 0, (3 << 30,), (0,))}
  for layout, write in LAYOUTS.items():
    cases.append((f"3*2^30 elements, stride 0, {layout}", write(tmp_path / f"s0.{layout}", stride0, one)))
    for stride in ((-200000, -1), (-(1 << 40),), (1 << 40,), (2, 1)):
      size = (2, 2) if len(stride) == 2 else (2,)
      view = {"w": tf.tensor(tf.Storage("0", numel=4), 1, size, stride)}
      cases.append((f"stride {stride}, {layout}", write(tmp_path / f"v{len(cases)}.{layout}", view, big)))
  # A zip member that inflates to 64 MiB from ~64 KiB (its header says so: refused before inflating).
  n = 1 << 24
  inflates = {"w": tf.tensor(tf.Storage("0", numel=n), 0, (n,), (1,))}
  cases.append(("zip member inflating 1000x", tf.zipped(tmp_path / "inflate.zip", inflates, {"0": bytes(4 * n)},
                                                         compression=zipfile.ZIP_DEFLATED)))
  return cases


def _check_refusals(results, cases):
  assert [r["case"] for r in results] == [c for c, _ in cases]
  for r in results:
    assert r["error"] == "TorchPickleError", r
    assert r["message"].startswith(r["path"] + ": ") and "\n" not in r["message"], r
    assert r["seconds"] < 2, r
  by_case = {r["case"]: r["message"] for r in results}
  assert "referenced twice" in by_case["shared-list tree"]
  assert "more than the" in by_case["3*2^30 elements, stride 0, zip"]
  assert "reaches element -" in by_case["stride (-200000, -1), legacy"]
  assert "reaches element" in by_case["stride (2, 1), zip"]
  assert "more than the" in by_case["zip member inflating 1000x"]


def test_bombs_and_views_refused_in_one_line_before_allocating(tmp_path):
  """In process (each is refused before its allocation or read): TorchPickleError in under 2 s."""
  import time  # pylint: disable=g-import-not-at-top
  cases, results = _cases(tmp_path), []
  for case, path in cases:
    t = time.time()
    with pytest.raises(torch_pickle.TorchPickleError) as e:
      torch_pickle.load(path)
    results.append({"case": case, "path": path, "error": type(e.value).__name__, "message": str(e.value),
                    "seconds": time.time() - t})
  _check_refusals(results, cases)


@pytest.mark.slow
def test_bombs_and_views_refused_in_one_line_within_memory_and_time(tmp_path):
  """The same in a child limited to 768 MiB of address space (what each would have taken: 4 GB and more)."""
  cases = _cases(tmp_path)
  code = tf.REFUSALS + f"""
from elmo_jax.formats import torch_pickle
refusals(torch_pickle.load, {cases!r}, (torch_pickle.TorchPickleError,))
"""
  _check_refusals(tf.run_limited(code), cases)


def test_negative_strides_inside_the_storage_read_as_torch_does(tmp_path):
  data = {"0": np.arange(6, dtype=np.float32)}
  flipped = {"w": tf.tensor(tf.Storage("0", numel=6), 5, (2, 3), (-3, -1)), "s": tf.tensor(tf.Storage("0", numel=6),
                                                                                          2, (), ())}
  for layout, write in LAYOUTS.items():
    got = torch_pickle.load(write(tmp_path / f"n.{layout}", flipped, data))
    assert got["w"].tolist() == [[5, 4, 3], [2, 1, 0]] and got["s"].shape == () and got["s"] == 2


def test_a_caller_bound_and_a_storage_named_twice(tmp_path):
  obj, data = tf.state({"w": np.zeros(1000, np.float32)})
  path = tf.legacy(tmp_path / "w.pkl", obj, data)
  assert torch_pickle.load(path, max_bytes=4000)["w"].shape == (1000,)
  with pytest.raises(torch_pickle.TorchPickleError, match=r"more than the 3,999 left"):
    torch_pickle.load(path, max_bytes=3999)
  twice = {"a": tf.tensor(tf.Storage("0", numel=2), 0, (2,), (1,)),
           "b": tf.tensor(tf.Storage("0", "IntStorage", numel=2), 0, (2,), (1,))}
  _refused(tf.legacy(tmp_path / "t.pkl", twice, {"0": np.zeros(2, np.float32)}), "named with two types")


def test_checked_refuses_ints_strings_shapes_and_non_finite():
  assert weights.checked(np.float64([1, 2]), (2,), "f: x").dtype == np.float32
  for value, why in ((np.int32([1, 2]), "holds int32 values, not floats"),
                     (np.array([b"1.0", b"2"], dtype=object), "holds object values, not floats"),
                     (np.float32([1, 2, 3]), "has shape (3,), options expect (2,)"),
                     (np.float32([1, np.nan]), "holds non-finite values"),
                     (np.float64([1, 1e300]), "holds non-finite values")):
    with pytest.raises(weights.WeightFileError) as e:
      weights.checked(value, (2,), "f: x")
    assert str(e.value) == f"f: x {why}"


def _efml_folder(folder, edit=None) -> str:
  """A tiny EFML folder (efml_util's architecture and dictionaries) with random weights, written by
  tests/torch_files.py (no torch); `edit(state)` changes token_embedder.pkl's arrays first."""
  import json  # pylint: disable=g-import-not-at-top
  import efml_util  # pylint: disable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  arch = efml_util.ARCHITECTURE
  json.dump({"config_path": "tiny.json"}, open(os.path.join(folder, "config.json"), "w"))
  json.dump(arch, open(os.path.join(folder, "tiny.json"), "w"))
  for name, vocab in (("char.dic", efml_util.CHARS), ("word.dic", efml_util.WORDS)):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
      f.writelines(f"{token}\t{i}\n" for i, token in enumerate(vocab))
  emb, enc = arch["token_embedder"], arch["encoder"]
  d, dim, proj, cell = sum(n for _, n in emb["filters"]), emb["char_dim"], enc["projection_dim"], enc["dim"]
  shapes = {"char_emb_layer.embedding.weight": (len(efml_util.CHARS), dim),
            "word_emb_layer.embedding.weight": (len(efml_util.WORDS), emb["word_dim"]),
            "projection.weight": (proj, emb["word_dim"] + d), "projection.bias": (proj,)}
  for i, (width, num) in enumerate(emb["filters"]):
    shapes.update({f"convolutions.{i}.weight": (num, dim, width), f"convolutions.{i}.bias": (num,)})
  for k in range(emb["n_highway"]):
    shapes.update({f"highways._layers.{k}.weight": (2 * d, d), f"highways._layers.{k}.bias": (2 * d,)})
  layers = {}
  for direction in ("forward", "backward"):
    for k in range(enc["n_layers"]):
      n = f"{direction}_layer_{k}"
      layers.update({f"{n}.input_linearity.weight": (4 * cell, proj), f"{n}.state_linearity.weight": (4 * cell, proj),
                     f"{n}.state_linearity.bias": (4 * cell,), f"{n}.state_projection.weight": (proj, cell)})
  rng = np.random.default_rng(0)
  for name, part in (("token_embedder.pkl", shapes), ("encoder.pkl", layers)):
    state = {k: rng.uniform(-0.6, 0.6, v).astype(np.float32) for k, v in part.items()}
    if edit is not None and name == "token_embedder.pkl":
      edit(state)
    tf.legacy(os.path.join(folder, name), *tf.state(state))
  return folder


def test_efml_nan_embeds_and_int_weights_refused_in_one_line(tmp_path):
  key = "char_emb_layer.embedding.weight"
  assert efml.load(_efml_folder(str(tmp_path / "ok")))[1]["char_cnn"]["char_embed"].dtype == np.float32
  for name, edit, why in (("nan", lambda s: s[key].fill(np.nan), "holds non-finite values"),
                          ("int", lambda s: s.update({key: s[key].astype(np.int32)}),
                           "holds int32 values, not floats")):
    folder = _efml_folder(str(tmp_path / name), edit)
    with pytest.raises(efml.EFMLError) as e:
      efml.load(folder)
    assert str(e.value) == f"{os.path.join(folder, 'token_embedder.pkl')}: '{key}' {why}"
