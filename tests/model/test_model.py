"""BiLM / Elmo module behaviour, and BiLM against the independent numpy reference (tests/reference.py)."""
from __future__ import annotations

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.data import chars
from elmo_jax.formats import weights as weights_lib
from elmo_jax.model import BiLM, BiLMConfig, Elmo, elmo_variables, zero_state
from elmo_jax.model import lstm as lstm_mod

from tiny import tiny_options
from reference import Reference

ATOL = 1e-5
SENTENCES = [["The", "bank", "flooded", "after", "the", "storm", "."],
             ["Money", "ée"],
             ["A", "loan", "from", "the", "bank"],
             ["x"]]
CELL_CLIP, PROJ_CLIP = 0.5, 0.2


_INIT = {}


def _init(options, seed=0):
  """Random params; one compiled init serves every config (the clip values do not shape the params)."""
  model = BiLM(BiLMConfig.from_options(options))
  if "f" not in _INIT:
    _INIT["f"] = jax.jit(BiLM(BiLMConfig.from_options(tiny_options())).init)
  params = _INIT["f"](jax.random.key(seed), np.zeros((1, 1, 50), np.int32))["params"]
  return model, jax.tree_util.tree_map(np.asarray, params)


def _apply(model, params, ids, **kw):
  return jax.jit(lambda p, x: model.apply({"params": p}, x, **kw))(params, ids)


@pytest.fixture(scope="module")
def clipped():
  """Random biLM with skip connections and small clips; LSTM weights scaled up so that the clips bind."""
  options = tiny_options(skip=True, cell_clip=CELL_CLIP, proj_clip=PROJ_CLIP)
  model, params = _init(options, seed=1)
  for name, layer in params["lstm"].items():
    layer["W_0"] = layer["W_0"] * 3.0
    layer["B"] = np.random.default_rng(len(name)).normal(0, 0.5, layer["B"].shape).astype(np.float32)
  return options, model, params


@pytest.fixture(scope="module")
def tiny():
  options = tiny_options(skip=True)
  model, params = _init(options, seed=0)
  return options, model, params


def _reference(options, params, tmp_path):
  path = tmp_path / "w.hdf5"
  weights_lib.save_hdf5(path, params, options)
  with h5py.File(path, "r") as f:
    raw = {}
    f.visititems(lambda n, o: raw.__setitem__(n, o[...]) if isinstance(o, h5py.Dataset) else None)
  return Reference(raw, options)


def _lib_vs_reference(options, model, params, tmp_path):
  ref = _reference(options, params, tmp_path)
  expected, (c_ref, h_ref) = ref.batch(SENTENCES)
  out = _apply(model, params, chars.batch_to_ids(SENTENCES))
  err = float(np.max(np.abs(np.asarray(out["layers"]) - expected)))
  state_err = max(float(np.max(np.abs(np.asarray(out["state"][0]) - c_ref))),
                  float(np.max(np.abs(np.asarray(out["state"][1]) - h_ref))))
  return err, state_err, ref


def test_matches_numpy_reference(clipped, tmp_path):
  options, model, params = clipped
  err, state_err, ref = _lib_vs_reference(options, model, params, tmp_path)
  # The clips must actually bind, otherwise this test says nothing about them.
  assert ref.clip_hits["cell"] > 10 and ref.clip_hits["proj"] > 10, ref.clip_hits
  assert err < ATOL, f"layers differ from the numpy reference by {err:.2e}"
  assert state_err < ATOL, f"final state differs from the numpy reference by {state_err:.2e}"


def _drop_clip(which):
  original = lstm_mod.lstm_scan

  def patched(gx, w_h, w_p, mask, c0, h0, cell_clip=None, proj_clip=None, *args):
    if which == "cell":
      cell_clip = None
    else:
      proj_clip = None
    return original(gx, w_h, w_p, mask, c0, h0, cell_clip, proj_clip, *args)
  return patched


# Skip connections and clipping are invisible on bilm-tf's fixture (no skip connections there, and its
# clips of 3.0 may not bind), so their mutation sensitivity is established here against the reference.
@pytest.mark.parametrize("mutation", ["no_skip_connections", "no_cell_clip", "no_proj_clip"])
def test_reference_mutation_sensitivity(mutation, clipped, tmp_path, monkeypatch):
  options, model, params = clipped
  if mutation == "no_skip_connections":
    lib_options = tiny_options(skip=False, cell_clip=CELL_CLIP, proj_clip=PROJ_CLIP)
    model = BiLM(BiLMConfig.from_options(lib_options))
    ref = _reference(options, params, tmp_path)
    expected, _ = ref.batch(SENTENCES)
    out = _apply(model, params, chars.batch_to_ids(SENTENCES))
    err = float(np.max(np.abs(np.asarray(out["layers"]) - expected)))
  else:
    monkeypatch.setattr(lstm_mod, "lstm_scan", _drop_clip(mutation.split("_")[1]))
    err, _, _ = _lib_vs_reference(options, model, params, tmp_path)
  assert err > 1e-3, f"{mutation} went unnoticed ({err:.2e})"


def test_output_shape_mask_and_layer0(tiny):
  options, model, params = tiny
  ids = chars.batch_to_ids(SENTENCES)
  out = _apply(model, params, ids)
  layers = np.asarray(out["layers"])
  assert layers.shape == (4, 3, 7, 12)  # [batch, n_layers + 1, time, 2P]
  lengths = [len(s) for s in SENTENCES]
  np.testing.assert_array_equal(np.asarray(out["mask"]), np.arange(7)[None] < np.array(lengths)[:, None])
  tok = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, method=BiLM.embed_tokens))(params, ids))
  np.testing.assert_allclose(layers[:, 0], np.concatenate([tok, tok], -1), atol=1e-6, rtol=0)
  for b, n in enumerate(lengths):
    assert np.all(layers[b, :, n:] == 0.0)
    assert np.all(np.abs(layers[b, 1:, :n]).max(-1) > 0)


def test_padding_does_not_change_results(tiny):
  """A sentence padded inside a longer batch (and to a longer time) == the sentence alone."""
  options, model, params = tiny
  alone = _apply(model, params, chars.batch_to_ids([SENTENCES[1]]))
  padded = _apply(model, params, chars.batch_to_ids([SENTENCES[0], SENTENCES[1]], pad_to=12))
  n = len(SENTENCES[1])
  np.testing.assert_allclose(np.asarray(padded["layers"])[1, :, :n], np.asarray(alone["layers"])[0],
                             atol=1e-6, rtol=0)
  assert np.all(np.asarray(padded["layers"])[1, :, n:] == 0.0)
  for s_pad, s_alone in zip(padded["state"], alone["state"]):
    np.testing.assert_allclose(np.asarray(s_pad)[:, :, 1], np.asarray(s_alone)[:, :, 0], atol=1e-6, rtol=0)


def test_stateless_is_order_independent(tiny):
  options, model, params = tiny
  perm = [2, 0, 3, 1]
  a = np.asarray(_apply(model, params, chars.batch_to_ids(SENTENCES))["layers"])
  b = np.asarray(_apply(model, params, chars.batch_to_ids([SENTENCES[i] for i in perm]))["layers"])
  np.testing.assert_allclose(b, a[perm], atol=1e-6, rtol=0)


def test_empty_sentence_row(tiny):
  options, model, params = tiny
  state = tuple(jnp.full(s.shape, 0.25) for s in zero_state(model.config, 2))
  out = jax.jit(lambda p, x, s: model.apply({"params": p}, x, state=s))(
      params, chars.batch_to_ids([SENTENCES[0], []]), state)
  layers = np.asarray(out["layers"])
  assert np.all(layers[1] == 0.0) and not np.any(np.asarray(out["mask"])[1])
  assert np.all(np.abs(layers[0, 1:]).max(-1) > 0)
  # The empty row's state is untouched; the other row's moved.
  for s in out["state"]:
    np.testing.assert_array_equal(np.asarray(s)[:, :, 1], 0.25)
    assert np.max(np.abs(np.asarray(s)[:, :, 0] - 0.25)) > 1e-3


def test_bfloat16_close_to_float32(tiny):
  options, model, params = tiny
  ids = chars.batch_to_ids(SENTENCES)
  f32 = np.asarray(_apply(model, params, ids)["layers"])
  bf16 = BiLM(BiLMConfig.from_options(options), dtype=jnp.bfloat16)
  out = np.asarray(_apply(bf16, params, ids)["layers"], np.float32)
  assert np.all(np.isfinite(out))
  err = np.max(np.abs(out - f32))
  assert err < 5e-2, err
  assert err > 0  # it really ran in bfloat16


# --- Elmo -----------------------------------------------------------------------------------------------
def _elmo(options, **kw):
  return Elmo(BiLMConfig.from_options(options), **kw)


@pytest.fixture(scope="module")
def ids():
  return chars.batch_to_ids(SENTENCES)


def _elmo_params(elmo, ids, bilm_params):
  """Elmo's params without compiling its init: the bilm part is loaded, the mixes start at (0, 1)."""
  shapes = jax.eval_shape(elmo.init, jax.random.key(0), ids)["params"]
  params = {"bilm": bilm_params}
  for k in range(elmo.num_output_representations):
    assert shapes[f"scalar_mix_{k}"]["scalar_parameters"].shape == (3,)
    params[f"scalar_mix_{k}"] = {"scalar_parameters": jnp.zeros(3), "gamma": jnp.ones(())}
  assert set(shapes) == set(params)
  assert jax.tree_util.tree_structure(shapes["bilm"]) == jax.tree_util.tree_structure(bilm_params)
  return params


def test_elmo_outputs_and_independent_mixes(tiny, ids):
  options, model, bilm_params = tiny
  elmo = _elmo(options, num_output_representations=2)
  params = _elmo_params(elmo, ids, bilm_params)
  assert set(params) == {"bilm", "scalar_mix_0", "scalar_mix_1"}
  params["scalar_mix_1"] = {"scalar_parameters": jnp.array([2.0, -1.0, 0.5]), "gamma": jnp.array(1.5)}
  out = jax.jit(lambda p, x: elmo.apply({"params": p}, x))(params, ids)
  reps, mask = out["elmo_representations"], out["mask"]
  assert isinstance(reps, list) and len(reps) == 2
  assert reps[0].shape == (4, 7, 12) and mask.shape == (4, 7)
  layers = np.asarray(_apply(model, bilm_params, ids)["layers"])
  np.testing.assert_allclose(np.asarray(reps[0]), layers.mean(axis=1), atol=1e-6, rtol=0)
  s = np.asarray(jax.nn.softmax(jnp.array([2.0, -1.0, 0.5])))
  np.testing.assert_allclose(np.asarray(reps[1]), 1.5 * np.einsum("l,bltd->btd", s, layers), atol=1e-5, rtol=0)

  # A loss on one representation moves only that representation's mix.
  def loss(p):
    return jnp.sum(elmo.apply({"params": p}, ids)["elmo_representations"][1] ** 2)
  g = jax.jit(jax.grad(loss))(params)
  assert all(np.all(np.asarray(x) == 0) for x in jax.tree_util.tree_leaves(g["scalar_mix_0"]))
  assert np.any(np.asarray(g["scalar_mix_1"]["scalar_parameters"]) != 0)
  # Frozen biLM (requires_grad=False, the default): no gradient reaches the bilm params.
  assert all(np.all(np.asarray(x) == 0) for x in jax.tree_util.tree_leaves(g["bilm"]))


def test_elmo_requires_grad_reaches_bilm(tiny, ids):
  requires_grad = True
  options, _, bilm_params = tiny
  elmo = _elmo(options, requires_grad=requires_grad)
  params = _elmo_params(elmo, ids, bilm_params)
  g = jax.jit(jax.grad(lambda p: jnp.sum(elmo.apply({"params": p}, ids)["elmo_representations"][0] ** 2)))(params)
  bilm_norm = sum(float(np.sum(np.abs(np.asarray(x)))) for x in jax.tree_util.tree_leaves(g["bilm"]))
  if requires_grad:
    assert bilm_norm > 0
  else:
    assert bilm_norm == 0.0
  assert np.any(np.asarray(g["scalar_mix_0"]["scalar_parameters"]) != 0)


@pytest.mark.parametrize("rows", [None, pytest.param((16, 32), marks=pytest.mark.slow)])
@pytest.mark.parametrize("n_words", [0, pytest.param(5, marks=pytest.mark.slow)])
def test_compact_char_cnn_equals_the_char_cnn_over_every_position(n_words, rows):
  """`embed_compact` (a frozen biLM's char CNN): each distinct token once (here 65 tokens, 45 distinct: one chunk
  of 64, or two of 32), at the narrowest exact width (a 48-char word needs all 50 ids) -- the CharCNN's values at
  every position, repeated words included; with a word id before the chars (ELMoForManyLangs) too."""
  from elmo_jax.model import char_cnn
  options = tiny_options()
  if n_words:
    options["char_cnn"]["word_embedding"] = {"n_words": n_words, "dim": 3}
  cfg = BiLMConfig.from_options(options)
  cnn = char_cnn.CharCNN(cfg)
  sentences = [["a", "bank", "x" * 48, "é"] * 5, ["the"] * 5 + [f"w{i}" for i in range(40)]]
  ids = chars.batch_to_ids(sentences, pad_to=50)
  for short in (False, True):  # the widest token 48 chars (50 ids), or 4 (a 16-id cut)
    long_word = (ids == chars.token_to_ids("x" * 48, 50)).all(-1, keepdims=True)
    x = np.where(long_word, chars.token_to_ids("y" * 4, 50), ids) if short else ids
    if n_words:
      x = np.concatenate([np.where(x.any(-1, keepdims=True), 2, 0), x], -1).astype(np.int32)
    params = jax.jit(cnn.init)(jax.random.key(1), x[:1, :1])
    want = np.asarray(jax.jit(cnn.apply)(params, x))
    has = x.any(-1)
    assert has.sum() == 65
    got = np.asarray(jax.jit(lambda p, i: char_cnn.embed_compact(
        lambda t: cnn.apply(p, t), i, 3, lead=int(bool(n_words)), rows=rows or char_cnn.COMPACT_ROWS))(params, x))
    np.testing.assert_allclose(got[has], want[has], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_frozen_elmo_runs_the_inference_form_with_the_same_values(tiny):
  """A frozen `Elmo` (requires_grad=False) skips padded positions and steps; a fine-tuned one runs them all: the
  same representations to float rounding, on sentences padded far past their lengths."""
  options, _, bilm_params = tiny
  padded = chars.batch_to_ids(SENTENCES, pad_to=40)
  got = {}
  for requires_grad in (False, True):
    elmo = _elmo(options, requires_grad=requires_grad, dropout=0.0)
    params = _elmo_params(elmo, padded, bilm_params)
    text = str(jax.jit(lambda p, x: elmo.apply({"params": p}, x)).lower(params, padded).as_text())
    assert ("stablehlo.case" in text) == (not requires_grad)  # the compact char CNN's choice of width
    got[requires_grad] = np.asarray(jax.jit(lambda p, x: elmo.apply({"params": p}, x))(params, padded)[
        "elmo_representations"][0])
  np.testing.assert_allclose(got[False], got[True], rtol=0, atol=1e-6)
  # `elmo_variables` makes a frozen biLM's constants once (<S>/</S>, the LSTM weights laid out): the same values
  elmo = _elmo(options, dropout=0.0)
  variables = elmo_variables(elmo, bilm_params)
  assert set(variables) == {"params", "bilm_constants"}
  assert variables["bilm_constants"]["boundary"].shape == (2, elmo.config.projection_dim)
  made = np.asarray(jax.jit(lambda v, x: elmo.apply(v, x))(variables, padded)["elmo_representations"][0])
  np.testing.assert_allclose(made, got[False], rtol=0, atol=1e-6)
  assert "bilm_constants" not in elmo_variables(_elmo(options, requires_grad=True), bilm_params)


def test_elmo_dropout_only_when_training(tiny, ids):
  options, _, bilm_params = tiny
  elmo = _elmo(options, dropout=0.5)
  params = _elmo_params(elmo, ids, bilm_params)
  run = jax.jit(lambda p, x, r: elmo.apply({"params": p}, x, deterministic=False, rngs={"dropout": r}))
  a = np.asarray(jax.jit(lambda p, x: elmo.apply({"params": p}, x))(params, ids)["elmo_representations"][0])
  t = np.asarray(run(params, ids, jax.random.key(3))["elmo_representations"][0])
  t2 = np.asarray(run(params, ids, jax.random.key(4))["elmo_representations"][0])
  assert np.any(t != t2)
  mask = np.asarray(ids.any(-1))
  valid_t, valid_a = t[mask], a[mask]
  dropped = valid_t == 0
  assert 0.3 < dropped.mean() < 0.7
  np.testing.assert_allclose(valid_t[~dropped], 2.0 * valid_a[~dropped], rtol=1e-6, atol=1e-6)


def test_elmo_stateful(tiny, ids):
  options, model, bilm_params = tiny
  elmo = _elmo(options, stateful=True, max_batch_size=6, dropout=0.0)
  params = _elmo_params(elmo, ids, bilm_params)
  fresh = {k: jnp.zeros(v.shape) for k, v in jax.eval_shape(elmo.init, jax.random.key(0), ids)["lstm_state"].items()}
  assert fresh["c"].shape == (2, 2, 6, 8) and np.all(np.asarray(fresh["c"]) == 0)
  run = jax.jit(lambda p, s, x: elmo.apply({"params": p, "lstm_state": s}, x, mutable=["lstm_state"]))
  out1, st1 = run(params, fresh, ids)
  out2, st2 = run(params, st1["lstm_state"], ids)
  r1, r2 = np.asarray(out1["elmo_representations"][0]), np.asarray(out2["elmo_representations"][0])
  assert np.max(np.abs(r1 - r2)) > 1e-4  # the carried state changes the second call
  # Stateless BiLM from zeros == the first stateful call; rows beyond the batch keep a zero state.
  stateless = np.asarray(_apply(model, bilm_params, ids)["layers"]).mean(axis=1)
  np.testing.assert_allclose(r1, stateless, atol=1e-6, rtol=0)
  assert np.all(np.asarray(st1["lstm_state"]["c"])[:, :, 4:] == 0)
  # The state carried is exactly the BiLM's final state.
  final = _apply(model, bilm_params, ids)["state"]
  np.testing.assert_allclose(np.asarray(st1["lstm_state"]["h"])[:, :, :4], np.asarray(final[1]), atol=1e-6)
  # Resetting (a fresh collection) reproduces the first call.
  out3, _ = run(params, fresh, ids)
  np.testing.assert_array_equal(np.asarray(out3["elmo_representations"][0]), r1)
  with pytest.raises(ValueError, match="max_batch_size"):
    elmo.apply({"params": params, "lstm_state": fresh}, chars.batch_to_ids([["a"]] * 7), mutable=["lstm_state"])


# --- dropout of the global batch (model/dropout.py) -------------------------------------------------------
def test_global_batch_dropout_equals_flax_dropout_and_its_row_slices():
  """`Dropout` draws `nn.Dropout`'s mask bit for bit; a shard of rows gets exactly its rows of that mask."""
  from flax import linen as nn
  from elmo_jax.model.dropout import Dropout
  x = jax.random.normal(jax.random.PRNGKey(3), (2, 12, 5, 7))
  for key in (jax.random.PRNGKey(7), jax.random.key(7)):
    full = nn.Dropout(0.3).apply({}, x, deterministic=False, rngs={"dropout": key})
    ours = Dropout(0.3).apply({}, x, False, None, 1, rngs={"dropout": key})
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(full))
    shard = Dropout(0.3).apply({}, x[:, 4:8], False, (4, 12), 1, rngs={"dropout": key})
    np.testing.assert_array_equal(np.asarray(shard), np.asarray(full[:, 4:8]))
  assert 0.2 < float(jnp.mean(full == 0)) < 0.4


def test_global_bits_past_two_to_the_32_elements():
  """Counters above 2**32 (a big global batch): the 64-bit index is split exactly (checked against numpy)."""
  from elmo_jax.model.dropout import _mul_wide
  a = np.array([0, 1, 65535, 65536, 2**31 + 12345, 2**32 - 1], np.uint32)
  for m in (1, 7, 40960, 2**20 + 3, 2**32 - 1):
    high, low = _mul_wide(jnp.asarray(a), m)
    want = a.astype(object) * m
    np.testing.assert_array_equal(np.asarray(high).astype(object), want >> 32)
    np.testing.assert_array_equal(np.asarray(low).astype(object), want & 0xFFFFFFFF)
