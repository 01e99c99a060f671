"""`ElmoNNX`: the `Elmo` contract as a Flax NNX module. It holds the variables and runs linen's `Elmo` on them
(`Elmo.apply`), so its outputs are linen's, bit for bit, by construction.

    elmo = pretrained.load_elmo_nnx("small", rngs=nnx.Rngs(0), dropout=0.5, l2_coef=1e-3)
    out = elmo(char_ids, deterministic=False)  # {"elmo_representations": [[batch, time, 2P]], "mask": [batch, time]}
    optimizer = nnx.Optimizer(task_model, optax.adamw(1e-3), wrt=nnx.Param)  # the biLM stays still

Its variables, by type (what an `nnx.Optimizer`'s `wrt` filter selects):
  `BiLMWeight` (`bilm`): the biLM's weights, linen's `params["bilm"]` tree. Not `nnx.Param`, so an optimizer over
    `nnx.Param` leaves them alone; fine-tuning names both types (`wrt=(nnx.Param, BiLMWeight)`, with
    `requires_grad=True`: only then is the biLM differentiable).
  `nnx.Param` (`scalar_mix_{k}`: `scalar_parameters`, `gamma`): the learned mixes; a fixed mix
    (`scalar_mix_parameters`) is a plain `nnx.Variable`, as it is not trained.
  `BiLMConstant` (`bilm_constants`, a frozen biLM only): what the weights alone decide (`bilm.InferenceConstants`),
    made from them (`rebuild_constants`), never trained and not worth checkpointing: the weights make them again.
  `nnx.RngState` (`rngs`): the dropout stream.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from elmo_jax.model.elmo import Elmo, bilm_constants, elmo_variables


class BiLMWeight(nnx.Variable):
  """A biLM weight: trained only where an optimizer's `wrt` names this type (fine-tuning)."""


class BiLMConstant(nnx.Variable):
  """A frozen biLM's inference constant, made from its weights (`ElmoNNX.rebuild_constants`), never trained."""


def _wrap(kind: type[nnx.Variable], tree: Any) -> Any:
  return jax.tree_util.tree_map(kind, tree)


def _values(tree: Any) -> Any:
  return jax.tree_util.tree_map(lambda v: v[...], tree, is_leaf=lambda v: isinstance(v, nnx.Variable))


class ElmoNNX(nnx.Module):
  """Linen's `Elmo` (its attributes: dropout, l2_coef, requires_grad, ...) as an NNX module, from biLM params.

  Not for `stateful` or `vocab_to_cache` (their collections change in the call or are made per vocabulary: linen's
  `Elmo` has them).
  """

  def __init__(self, elmo: Elmo, bilm_params: Any, *, rngs: nnx.Rngs):
    if elmo.stateful or elmo.vocab_to_cache is not None:
      raise ValueError("ElmoNNX takes no stateful=True or vocab_to_cache: use linen's Elmo (pretrained.load_elmo)")
    self.elmo = nnx.static(elmo)
    variables = elmo_variables(elmo, bilm_params)
    self.bilm = nnx.data(_wrap(BiLMWeight, variables["params"]["bilm"]))
    mix = nnx.Param if elmo.scalar_mix_parameters is None else nnx.Variable
    for k in range(elmo.num_output_representations):
      setattr(self, f"scalar_mix_{k}", nnx.data(_wrap(mix, variables["params"][f"scalar_mix_{k}"])))
    made = variables.get("bilm_constants")
    self.bilm_constants = nnx.data(None if made is None else _wrap(BiLMConstant, made))
    self.rngs = rngs["dropout"].fork()

  def _mixes(self) -> list[dict[str, nnx.Variable]]:
    return [getattr(self, f"scalar_mix_{k}") for k in range(self.elmo.num_output_representations)]

  def __call__(self, char_ids: jax.Array, deterministic: bool = True) -> dict[str, Any]:
    """char_ids: [batch, time, 50] from `batch_to_ids`.

    Returns linen `Elmo`'s {"elmo_representations": list of [batch, time, 2P], "mask": [batch, time] bool}; with
    `deterministic=False` its dropout draws from the module's "dropout" stream.
    """
    params = {"bilm": _values(self.bilm)}
    for k, mix in enumerate(self._mixes()):
      params[f"scalar_mix_{k}"] = _values(mix)
    variables = {"params": params}
    if self.bilm_constants is not None:
      variables["bilm_constants"] = _values(self.bilm_constants)
    rngs = {} if deterministic or self.elmo.dropout == 0.0 else {"dropout": self.rngs()}
    return self.elmo.apply(variables, char_ids, deterministic, rngs=rngs)

  def l2_loss(self) -> jax.Array | float:
    """The mixes' L2 term, `l2_coef * sum(w ** 2)` summed over the mixes: what linen's `Elmo` sows into "losses"
    (bilm-tf's weight_layers regulariser, toward uniform weights); 0.0 without `l2_coef`. Add it to the loss."""
    if self.elmo.l2_coef <= 0.0:
      return 0.0
    return sum(self.elmo.l2_coef * jnp.sum(mix["scalar_parameters"][...] ** 2) for mix in self._mixes())

  def rebuild_constants(self) -> None:
    """Makes a frozen biLM's constants again from its weights: after its weights were set other than by the load
    (e.g. restored from a checkpoint that holds other weights). Nothing to do for `requires_grad=True`."""
    if self.bilm_constants is None:
      return
    made = bilm_constants(self.elmo, _values(self.bilm))
    jax.tree_util.tree_map(lambda v, x: v.set_value(x), self.bilm_constants, made,
                           is_leaf=lambda v: isinstance(v, nnx.Variable))
