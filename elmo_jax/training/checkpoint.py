"""Orbax checkpoints of the whole training run, with checksums, verification and quarantine of bad steps.

Layout under `directory` (normally `workdir/checkpoints`):
  <step>/{state,meta}/...      Orbax's step folders: "state" is the TrainState (params, optimizer state, step,
                               RNG, carried LSTM state), "meta" a JSON item (data-iterator states, vocab hash,
                               config, the open metrics window).
  checksums/<step>.json        sha256 of every file of the finalized step folder (in a bucket: the crc32c the
                               bucket keeps for every object, so checking downloads nothing), written by
                               process 0 right after Orbax finalizes the (asynchronous) save.
  bad/<step>-<reason>/         steps found unreadable or corrupt on restore, moved aside (never deleted) so that
                               `max_to_keep` garbage collection cannot drop the last good step in their favour.

`directory` may be a bucket URL (`gs://...`): Orbax writes there itself, and every other file operation here
goes through `elmo_jax.runtime.storage`.

Orbax itself has no checksums (a flipped byte restores silently) and takes any integer-named folder as a step
(an empty one becomes "latest" and fails to restore); `restore` handles both by falling back to the newest
step that verifies.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from elmo_jax.runtime import log
from elmo_jax.runtime import storage


class IncompatibleCheckpointError(ValueError):
  """The checkpoint is intact but belongs to another configuration (vocab, model shape, batch)."""


def _is_main() -> bool:
  return jax.process_index() == 0


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def _digest_kind(directory: str) -> str:
  """What a checksum file records: sha256 of local files, the bucket's own crc32c of objects."""
  return "crc32c" if storage.is_remote(directory) else "sha256"


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:200] if text else ''}"


class Checkpointer:
  """Saves asynchronously (the step loop does not wait for the disk) and keeps the last `keep` steps."""

  def __init__(self, directory: str, keep: int = 3, async_save: bool = True, read_only: bool = False):
    if storage.is_remote(directory):
      storage.check_url(directory)  # tensorstore would cut a path at '#' and put the arrays elsewhere
    self.directory = directory if storage.is_remote(directory) else os.path.abspath(directory)
    self.checksum_dir = storage.join(self.directory, "checksums")
    self.bad_dir = storage.join(self.directory, "bad")
    self.read_only = read_only
    self._lock = threading.Lock()
    self._unhashed: set[int] = set()  # steps this process saved whose checksum is not written yet
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=not read_only,
            read_only=read_only),
    )

  # --- saving -----------------------------------------------------------------------------------------
  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    with self._lock:
      self._unhashed.add(step)
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)), force=True)
    if _is_main():
      # Hash from a background thread as soon as Orbax has committed the step, so a checksum never
      # stalls a train step. (Orbax's post_finalization_callback runs before the tmp folder is renamed.)
      threading.Thread(target=self._checksum_when_committed, args=(step,), daemon=True).start()

  def _checksum_when_committed(self, step: int, poll_s: float = 0.05, give_up_s: float = 600.0) -> None:
    deadline = time.time() + give_up_s
    while step in self._unhashed and time.time() < deadline:
      if not self.manager.is_saving_in_progress():
        self._write_checksums()
      time.sleep(poll_s)  # not committed yet; `wait()` writes it at the latest

  def _write_checksums(self) -> None:
    """Writes checksums/<step>.json for finalized steps saved by this run; drops those of collected steps."""
    if not _is_main() or self.read_only:
      return
    with self._lock:
      storage.makedirs(self.checksum_dir)
      kind = _digest_kind(self.directory)
      for step in sorted(self._unhashed):
        step_dir = storage.join(self.directory, str(step))
        if not storage.exists(storage.join(step_dir, "_CHECKPOINT_METADATA")):
          continue  # not finalized yet (or already garbage-collected); a later callback handles it
        storage.write_json(storage.join(self.checksum_dir, f"{step}.json"),
                           {"step": step, kind: storage.tree_digests(step_dir, kind)})
        self._unhashed.discard(step)
      for name in storage.listdir(self.checksum_dir):
        stem = name.split(".")[0]
        if stem.isdigit() and not storage.isdir(storage.join(self.directory, stem)):
          storage.remove(storage.join(self.checksum_dir, name))  # step removed by max_to_keep

  def wait(self) -> None:
    """Blocks until the last save is on disk and checksummed."""
    self.manager.wait_until_finished()
    self._write_checksums()

  def close(self) -> None:
    self.wait()
    self.manager.close()

  # --- restoring --------------------------------------------------------------------------------------
  def verify(self, step: int) -> str | None:
    """None if `step` matches its stored checksums; else why not. 'no checksum' when none was written."""
    path = storage.join(self.checksum_dir, f"{step}.json")
    if not storage.exists(path):
      return "no checksum"
    try:
      record = json.loads(storage.read_bytes(path))
      kind = next(k for k in ("sha256", "crc32c") if k in record)
      expected = record[kind]
    except (OSError, ValueError, StopIteration, TypeError) as e:
      return f"unreadable checksum file ({_first_line(e)})"
    actual = storage.tree_digests(storage.join(self.directory, str(step)), kind)
    for name, digest in expected.items():
      if name not in actual:
        return f"file {name} is missing"
      if actual[name] != digest:
        return f"file {name} fails its {kind} checksum"
    extra = sorted(set(actual) - set(expected))
    return f"unexpected file {extra[0]}" if extra else None

  def restore(self, abstract_state: Any,
              check_meta: Callable[[dict[str, Any]], None] | None = None) -> tuple[int, Any, dict[str, Any]] | None:
    """Restores the newest good step into the shapes/shardings of `abstract_state`; None if there is none.

    A step that fails its checksum, or has none and cannot be restored (empty or truncated folder), is
    reported, moved to bad/ (unless read-only) and the previous step is tried. `check_meta(meta)` may raise
    `IncompatibleCheckpointError` to refuse a checkpoint of another configuration; that is not a fault of
    the checkpoint, so it propagates. A step that verifies but fails to restore also propagates: the
    bytes are the ones we wrote, so the config must differ, and moving good checkpoints aside would be wrong.
    """
    def load(step: int) -> tuple[Any, dict[str, Any]]:
      meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
      if check_meta is not None:
        check_meta(meta)
      state = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state)))["state"]
      return state, meta

    found = self.restore_newest(load)
    return None if found is None else (found[0], *found[1])

  def restore_newest(self, load: Callable[[int], Any], steps: list[int] | None = None,
                     verified_must_load: bool = True) -> tuple[int, Any] | None:
    """(step, load(step)) for the newest of `steps` (default: all) that verifies and loads; None if none.

    Each step is hashed once. A step that fails its checksum, or has none and does not load, is set aside
    (`_set_aside`) and the previous one tried. One that verifies but does not load raises
    IncompatibleCheckpointError with `verified_must_load` (the bytes are ours, so the config differs), else
    it is skipped too. IncompatibleCheckpointError from `load` always propagates.
    """
    for step in reversed(self.all_steps() if steps is None else steps):
      reason = self.verify(step)
      if reason is None or reason == "no checksum":
        try:
          loaded = load(step)
        except IncompatibleCheckpointError:
          raise
        except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise many types for unreadable data
          if reason is None and verified_must_load:
            raise IncompatibleCheckpointError(
                f"{self.directory}/{step} verifies but does not restore into this config's state "
                f"({_first_line(e)}); was the workdir trained with another config?") from None
          reason = f"cannot be restored ({_first_line(e)})"
        else:
          if reason is not None:
            log.info(f"warning: checkpoint step {step} has no checksum (the run stopped before writing it); "
                     "restored it unverified")
          return step, loaded
      self._set_aside(step, reason)
    return None

  def _set_aside(self, step: int, reason: str) -> None:
    if self.read_only:
      log.info(f"warning: checkpoint step {step} in {self.directory} is unusable: {reason}; skipping it")
      return
    slug = re.sub(r"[^a-z0-9]+", "-", reason.lower()).strip("-")[:60]
    target = storage.join(self.bad_dir, f"{step}-{slug}")
    log.info(f"warning: checkpoint step {step} is unusable: {reason}; moved it to {target} and trying the "
             "previous step")
    _barrier(f"ckpt_bad_{step}_a")  # every process has decided before process 0 moves the folder
    if _is_main():
      storage.makedirs(self.bad_dir)
      suffix = 0
      while storage.exists(target + (f".{suffix}" if suffix else "")):
        suffix += 1
      target += f".{suffix}" if suffix else ""
      storage.move(storage.join(self.directory, str(step)), target)
      checksum = storage.join(self.checksum_dir, f"{step}.json")
      if storage.exists(checksum):
        storage.move(checksum, storage.join(target, "checksum.json"))
    _barrier(f"ckpt_bad_{step}_b")
    self.manager.reload()


def newest_meta(directory: str) -> tuple[int, dict[str, Any]] | None:
  """(step, meta) of the newest step folder whose meta item reads, without Orbax or devices: what a run's
  preflight compares its config with before anything is written. None when there is no such step."""
  for step in sorted((int(d) for d in storage.listdir(directory) if d.isdigit()), reverse=True):
    try:
      meta = json.loads(storage.read_bytes(storage.join(directory, str(step), "meta", "metadata")))
    except (OSError, ValueError):
      continue  # unreadable: the restore sets it aside and falls back, as it does here
    if isinstance(meta, dict):
      return step, meta
  return None


def abstract_like(state: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a live state, the restore target."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), state)


def gather_process_states(local: dict[str, Any]) -> list[dict[str, Any]]:
  """Every process's JSON-able `local` (e.g. its data-iterator state), in process order, on all processes."""
  if jax.process_count() == 1:
    return [local]
  from jax.experimental import multihost_utils
  raw = json.dumps(local).encode()
  size = int(np.max(multihost_utils.process_allgather(np.array([len(raw)], np.int64))))
  rows = multihost_utils.process_allgather(np.frombuffer(raw.ljust(size), np.uint8))
  return [json.loads(bytes(row).rstrip(b" ")) for row in np.asarray(rows)]
