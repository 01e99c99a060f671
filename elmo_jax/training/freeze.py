"""A biLM kept still: in a task model for good (`freeze_bilm`), or for the first steps of a run (`bilm_frozen_for`).

    tx = freeze.freeze_bilm(optax.adamw(1e-3))    # a task model's optimizer: the biLM's params never move

`config.freeze_bilm_steps`: the softmax alone trains for the first N steps of a run, then everything.

bilm-tf's restart on new text with a new vocabulary starts from a random softmax; its first, large
gradients would flow into the pretrained biLM. Freezing the biLM until the softmax has settled avoids that.

The switch is inside the jit-compiled step (a comparison with a step counter kept in the optimizer state),
so one compiled step serves both phases and a checkpoint taken in the frozen phase resumes exactly.
The biLM and the softmax get separate copies of the optimizer (`optax.multi_transform`): while frozen, the
biLM's copy does not move at all — no update, and its state (Adagrad's accumulator, Adam's moments *and*
its step count, a warmup schedule's count) stays where it was, so after the switch Adam's bias correction
and any warmup start afresh for the biLM. Gradient clipping stays global; while frozen it sees only the
softmax's gradients.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax


def _is_bilm(path: Sequence[Any]) -> bool:
  return any(getattr(k, "key", getattr(k, "name", None)) == "bilm" for k in path)


def bilm_labels(params: Any) -> Any:
  """"frozen" for every param under a `bilm` module (at any depth), "trainable" for the rest."""
  return jax.tree_util.tree_map_with_path(lambda p, _: "frozen" if _is_bilm(p) else "trainable", params)


def freeze_bilm(tx):
  """`tx` for everything but the biLM, whose updates are exactly zero (`optax.set_to_zero`).

  Unlike `stop_gradient` alone (`Elmo(requires_grad=False)`), this also keeps AdamW's weight decay and
  momentum from moving the "frozen" weights.
  """
  return optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, bilm_labels)


class FrozenBiLMState(NamedTuple):
  count: jax.Array  # updates applied so far in this run; the biLM is frozen while count < steps
  clip: optax.OptState
  split: optax.OptState  # multi_transform state: inner_states {"frozen": biLM copy, "trainable": softmax}


def bilm_frozen_for(steps: int, clip: optax.GradientTransformation,
                    tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`chain(clip, tx)` except that for the first `steps` updates the biLM params and their state stay put."""
  split = optax.multi_transform({"frozen": tx, "trainable": tx}, bilm_labels)

  def init(params: Any) -> FrozenBiLMState:
    return FrozenBiLMState(count=jnp.zeros([], jnp.int32), clip=clip.init(params), split=split.init(params))

  def update(grads: Any, state: FrozenBiLMState, params: Any = None):
    frozen = state.count < steps

    def zero_bilm(tree):
      # Exact zeros (jnp.where, not a multiply): a NaN or inf gradient of a frozen weight stays out.
      return jax.tree_util.tree_map(
          lambda label, x: jnp.where(frozen, jnp.zeros_like(x), x) if label == "frozen" else x,
          bilm_labels(tree), tree)

    grads, clip_state = clip.update(zero_bilm(grads), state.clip, params)
    updates, split_state = split.update(grads, state.split, params)
    inner = dict(split_state.inner_states)
    inner["frozen"] = jax.tree_util.tree_map(lambda new, old: jnp.where(frozen, old, new), inner["frozen"],
                                             state.split.inner_states["frozen"])
    split_state = split_state._replace(inner_states=inner)
    return zero_bilm(updates), FrozenBiLMState(state.count + 1, clip_state, split_state)

  return optax.GradientTransformation(init, update)
