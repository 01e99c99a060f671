"""Orbax checkpoints of the whole training run: train state + data-iterator state + run metadata."""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `checkpoint_every_steps` (asynchronously) and at the end; keeps the last `keep`.

  A checkpoint holds params, optimizer state, step, RNG and the carried LSTM state ("state"), and a JSON
  item ("meta") with the data-iterator state, the vocab hash and the config.
  """

  def __init__(self, directory: str, keep: int = 3, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                             create=True),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict[str, Any]] | None:
    """Restores `step` (default: latest) into the shapes/shardings of `abstract_state`; None if no checkpoint."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    restored = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored["state"], restored["meta"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def abstract_like(state: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a live state, the restore target."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), state)
