"""`pretrained.load_elmo_nnx`: linen `Elmo`'s outputs and L2 term bit for bit (bilm-tf's fixture, the tiny model, the
`small` preset, under `nnx.jit`, on 8 devices), a biLM frozen by construction under `nnx.Optimizer(wrt=nnx.Param)`,
fine-tuned when named, and Orbax checkpoints of `nnx.state` restored to the same outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import launch_util
import tiny
from elmo_jax.data import chars
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.model import BiLM, BiLMConfig
from elmo_jax.model.elmo_nnx import BiLMConstant, BiLMWeight
from elmo_jax.sources import pretrained
from elmo_jax.training.freeze import bilm_labels
from paths import FIXTURE_DIR, REPO_ROOT

with open(os.path.join(FIXTURE_DIR, "lm_embeddings_sentences.json")) as _f:
  SENTENCES = [s.split() for row in json.load(_f) for s in row]
BATCH = [SENTENCES[0][:9], SENTENCES[1][:2], ["zzyzx", "and", "Qwertyuiop", "."], ["the"]]
IDS = chars.batch_to_ids(BATCH)
MIX = {"scalar_parameters": np.asarray([0.3, -0.2, 0.5], np.float32), "gamma": np.asarray(1.7, np.float32)}


def _leaves(tree):
  return [np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
          for x in jax.tree_util.tree_leaves(tree)]


def _assert_same(got, want):
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
  for a, b in zip(_leaves(got), _leaves(want)):
    np.testing.assert_array_equal(a, b)


def _pure(state):
  return nnx.to_pure_dict(state)


def _compare(spec, ids, **kwargs):
  """The NNX module's outputs and L2 term under nnx.jit against linen `Elmo`'s under jax.jit, one mix set to
  MIX in both (a trained mix, not the uniform start)."""
  model = pretrained.load_elmo_nnx(spec, rngs=nnx.Rngs(0), **kwargs)
  elmo, variables = pretrained.load_elmo(spec, **kwargs)
  variables["params"]["scalar_mix_0"] = {k: jnp.asarray(v) for k, v in MIX.items()}
  for name, value in MIX.items():
    model.scalar_mix_0[name].set_value(jnp.asarray(value))
  got, l2 = nnx.jit(lambda m, x: (m(x), m.l2_loss()))(model, ids)
  want, aux = jax.jit(lambda v, x: elmo.apply(v, x, mutable=["losses"]))(variables, ids)
  _assert_same(got, want)
  assert np.asarray(l2) == np.asarray(sum(jax.tree_util.tree_leaves(aux["losses"])))
  return model, variables


@pytest.mark.parametrize("requires_grad", [False, True])
def test_fixture_outputs_and_l2_equal_linen_bit_for_bit(requires_grad):
  model, variables = _compare(FIXTURE_DIR, IDS, dropout=0.0, l2_coef=0.25, num_output_representations=2,
                              requires_grad=requires_grad)
  # The variables by type: the biLM's weights, the mixes (nnx.Param), a frozen biLM's constants.
  _assert_same(_pure(nnx.state(model, BiLMWeight))["bilm"], variables["params"]["bilm"])
  assert set(_pure(nnx.state(model, nnx.Param))) == {"scalar_mix_0", "scalar_mix_1"}
  constants = _pure(nnx.state(model, BiLMConstant))
  if requires_grad:
    assert constants == {} and "bilm_constants" not in variables
  else:
    _assert_same(constants["bilm_constants"], variables["bilm_constants"])


def _write_model(folder, options, scale: float) -> str:
  """`options` with seeded normal params (numpy, nothing compiled) as options.json + weights.hdf5 in `folder`."""
  shapes = jax.eval_shape(BiLM(BiLMConfig.from_options(options)).init, jax.random.key(0),
                          np.zeros((1, 1, 50), np.int32))["params"]
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(lambda s: (scale * rng.standard_normal(s.shape)).astype(np.float32), shapes)
  weights_lib.save_hdf5(os.path.join(folder, "weights.hdf5"), params, options)
  options_lib.save(options, os.path.join(folder, "options.json"))
  return os.fspath(folder)


def test_tiny_model_equals_linen_and_refuses_what_it_does_not_take(tmp_path):
  spec = _write_model(tmp_path, tiny.tiny_options(), 0.5)
  _compare(spec, IDS, dropout=0.0, l2_coef=1e-3)
  with pytest.raises(ValueError, match="^ElmoNNX takes no stateful=True or vocab_to_cache: use linen's Elmo"):
    pretrained.load_elmo_nnx(spec, rngs=nnx.Rngs(0), stateful=True)


def test_constants_follow_weights_set_after_the_load_and_dropout_draws_its_stream(tmp_path):
  first, other = (_write_model(tmp_path / name, tiny.tiny_options(), scale) for name, scale in (("a", 0.5), ("b", 0.3)))
  model = pretrained.load_elmo_nnx(first, rngs=nnx.Rngs(0), dropout=0.5)
  elmo, variables = pretrained.load_elmo(other, dropout=0.5)
  nnx.update(model, nnx.state(pretrained.load_elmo_nnx(other, rngs=nnx.Rngs(0), dropout=0.5), BiLMWeight))
  model.rebuild_constants()
  _assert_same(_pure(nnx.state(model, BiLMConstant))["bilm_constants"], variables["bilm_constants"])
  call = nnx.jit(lambda m, x, deterministic: m(x, deterministic), static_argnums=2)
  _assert_same(call(model, IDS, True), jax.jit(elmo.apply)(variables, IDS))
  first_draw, second_draw = (np.asarray(call(model, IDS, False)["elmo_representations"][0]) for _ in range(2))
  assert not np.array_equal(first_draw, second_draw)  # each call takes the stream's next key
  assert np.any(first_draw == 0) and not np.array_equal(first_draw, np.asarray(call(model, IDS, True)[
      "elmo_representations"][0]))


@pytest.mark.slow  # the small preset's programs compile for seconds
def test_small_preset_equals_linen(tmp_path):
  spec = _write_model(tmp_path, options_lib.validate(options_lib.preset("small")), 0.05)
  _compare(spec, IDS, dropout=0.0, l2_coef=1e-3)


class Tagger(nnx.Module):
  """A POS tagger head: ELMo's first mix -> a dense layer -> tags."""

  def __init__(self, elmo, n_tags: int, rngs: nnx.Rngs):
    self.elmo = elmo
    self.dense = nnx.Linear(2 * elmo.elmo.config.projection_dim, n_tags, rngs=rngs)

  def __call__(self, char_ids, train: bool = False):
    out = self.elmo(char_ids, deterministic=not train)
    return self.dense(out["elmo_representations"][0]), out["mask"]


TAGS = jnp.asarray(np.random.default_rng(0).integers(0, 3, IDS.shape[:2]))


@nnx.jit
def _train_step(model, optimizer, ids, tags):
  def loss_fn(model):
    logits, mask = model(ids, train=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tags)
    return jnp.sum(ce * mask) / jnp.sum(mask) + model.elmo.l2_loss()
  loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, optimizer.wrt))(model)
  optimizer.update(model, grads)
  return loss


def _tagger(requires_grad: bool, seed: int = 0) -> Tagger:
  elmo = pretrained.load_elmo_nnx(FIXTURE_DIR, rngs=nnx.Rngs(seed), dropout=0.5, l2_coef=0.1,
                                  requires_grad=requires_grad)
  return Tagger(elmo, 3, nnx.Rngs(seed))


@nnx.jit
def _predict(model, ids):
  return model(ids)


@pytest.fixture(scope="module")
def frozen():
  """A tagger trained 4 steps over a frozen biLM under AdamW's weight decay, and its biLM state before."""
  model = _tagger(requires_grad=False)
  before = _pure(nnx.state(model, nnx.Any(BiLMWeight, BiLMConstant)))
  optimizer = nnx.Optimizer(model, optax.adamw(1e-2, weight_decay=0.5), wrt=nnx.Param)
  losses = [float(_train_step(model, optimizer, IDS, TAGS)) for _ in range(4)]
  return model, before, losses


def test_frozen_bilm_stays_exactly_and_the_mix_trains(frozen):
  model, before, losses = frozen
  assert losses[-1] < losses[0]
  _assert_same(_pure(nnx.state(model, nnx.Any(BiLMWeight, BiLMConstant))), before)
  assert np.any(np.asarray(model.elmo.scalar_mix_0["scalar_parameters"][...]) != 0)


def test_fine_tuned_bilm_moves_at_its_own_rate(tmp_path):
  model = _tagger(requires_grad=True)
  before = _pure(nnx.state(model, BiLMWeight))
  tx = optax.multi_transform({"frozen": optax.adamw(1e-4), "trainable": optax.adamw(1e-2)}, bilm_labels)
  optimizer = nnx.Optimizer(model, tx, wrt=(nnx.Param, BiLMWeight))
  losses = [float(_train_step(model, optimizer, IDS, TAGS)) for _ in range(2)]
  assert np.isfinite(losses).all()
  after = _pure(nnx.state(model, BiLMWeight))
  moved = [np.max(np.abs(a - b)) for a, b in zip(_leaves(after), _leaves(before))]
  assert 0 < max(moved) < 5e-4  # two AdamW steps of about 1e-4 each (the task layers take 1e-2)
  # A fine-tuned biLM is saved in the checkpoint (nothing of it comes from the spec any more); restored into
  # a fresh model, the same outputs.
  saved = nnx.state(model, nnx.Not(BiLMConstant))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "ckpt", saved)
    checkpointer.wait_until_finished()
    fresh = _tagger(requires_grad=True, seed=1)
    nnx.update(fresh, checkpointer.restore(tmp_path / "ckpt", nnx.state(fresh, nnx.Not(BiLMConstant))))
  _assert_same(_predict(fresh, IDS), _predict(model, IDS))


def test_orbax_checkpoint_of_a_frozen_tagger_references_the_bilm(frozen, tmp_path):
  model, _, _ = frozen
  # What training changed (the mix, the head, the dropout stream): the frozen biLM's weights come from the spec
  # and its constants from them, so neither is saved.
  trained = nnx.Not(nnx.Any(BiLMWeight, BiLMConstant))
  saved = nnx.state(model, trained)
  assert set(_pure(saved)["elmo"]) == {"scalar_mix_0", "rngs"}
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "ckpt", saved)
    checkpointer.wait_until_finished()
    fresh = _tagger(requires_grad=False, seed=1)
    nnx.update(fresh, checkpointer.restore(tmp_path / "ckpt", nnx.state(fresh, trained)))
  _assert_same(nnx.state(fresh), nnx.state(model))
  _assert_same(_predict(fresh, IDS), _predict(model, IDS))


_EIGHT = textwrap.dedent(r"""
  import json, sys
  import jax, numpy as np
  from flax import nnx
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  from elmo_jax.data import chars
  from elmo_jax.sources import pretrained
  spec, sentences = sys.argv[1], json.loads(sys.argv[2])
  kwargs = dict(dropout=0.0, l2_coef=0.25)
  model = pretrained.load_elmo_nnx(spec, rngs=nnx.Rngs(0), **kwargs)
  elmo, variables = pretrained.load_elmo(spec, **kwargs)
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  ids = chars.batch_to_ids(sentences)
  alone = np.asarray(jax.jit(elmo.apply)(variables, ids)["elmo_representations"][0])
  ids = jax.device_put(ids, NamedSharding(mesh, P("batch")))
  replicated = NamedSharding(mesh, P())
  nnx.update(model, jax.device_put(nnx.state(model), replicated))
  variables = jax.device_put(variables, replicated)
  got, l2 = nnx.jit(lambda m, x: (m(x), m.l2_loss()))(model, ids)
  want, aux = jax.jit(lambda v, x: elmo.apply(v, x, mutable=["losses"]))(variables, ids)
  same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree_util.tree_leaves(got),
                                                                          jax.tree_util.tree_leaves(want)))
  rep = got["elmo_representations"][0]
  print(json.dumps({"devices": jax.device_count(), "shards": len(rep.sharding.device_set), "same": same,
                    "l2_same": float(l2) == float(sum(jax.tree_util.tree_leaves(aux["losses"]))),
                    "max_vs_one_device": float(np.max(np.abs(np.asarray(rep) - alone)))}))
""")


@pytest.mark.slow  # a subprocess on 8 simulated devices
def test_sharded_over_8_devices_equals_linen_bit_for_bit(tmp_path):
  script = tmp_path / "eight.py"
  script.write_text(_EIGHT)
  sentences = (BATCH * 2)[:8]
  env = {**os.environ, "XLA_FLAGS": launch_util.xla_flags(8), "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
  done = subprocess.run([sys.executable, str(script), FIXTURE_DIR, json.dumps(sentences)], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["devices"] == 8 and result["shards"] == 8, result
  assert result["same"] and result["l2_same"], result
  assert result["max_vs_one_device"] < 1e-5, result
