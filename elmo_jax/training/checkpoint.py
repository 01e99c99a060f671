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
from elmo_jax.runtime import watchdog
from elmo_jax.runtime import distributed


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


def _committed(step_dir: str) -> bool:
  """Orbax has finalized the step: a local step folder exists only once renamed from its temporary name (its
  metadata inside); in a bucket, where the folder is written in place, the marker Orbax writes last."""
  return storage.exists(storage.join(step_dir, "commit_success.txt" if storage.is_remote(step_dir)
                                     else "_CHECKPOINT_METADATA"))


class CheckpointSaveError(RuntimeError):
  """A save failed (a disk or bucket refused it); one line naming the step, the folder and the last good step."""


class Checkpointer:
  """Saves asynchronously (the step loop does not wait for the disk) and keeps the last `keep` steps.

  Every save has a deadline, `timeout_s` after it began: a save that failed raises CheckpointSaveError at
  the next `check()` (the loop asks after every step) or `wait()`; one that does not finish in time (a disk
  or bucket that stops answering, stuck in native code) ends the process with one line (`watchdog`). Either
  way the newest committed step stays the one a rerun resumes from.
  """

  def __init__(self, directory: str, keep: int = 3, async_save: bool = True, read_only: bool = False,
               timeout_s: float = 600.0):
    if storage.is_remote(directory):
      storage.check_url(directory)  # tensorstore would cut a path at '#' and put the arrays elsewhere
    self.directory = directory if storage.is_remote(directory) else os.path.abspath(directory)
    self.checksum_dir = storage.join(self.directory, "checksums")
    self.bad_dir = storage.join(self.directory, "bad")
    self.read_only = read_only
    self.timeout_s = timeout_s
    self._lock = threading.Lock()
    self._unhashed: set[int] = set()  # steps this process saved whose checksum is not written yet
    self._finishing: list[threading.Thread] = []  # one per save: waits for its commit, writes its checksum
    self._failed: str | None = None  # the first failed save, as its one line
    self._deadlines: list[Callable[[], bool]] = []  # the saves' deadlines, cancelled at the latest by close()
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=not read_only,
            read_only=read_only),
    )
    self.last_good = self.latest_step()  # the newest step this run knows to be committed

  # --- saving -----------------------------------------------------------------------------------------
  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts saving `step`; raises CheckpointSaveError if an earlier save failed (on any process: every
    process saves at the same steps) or this one is refused."""
    self.check(all_processes=True)
    cancel = self.deadline(f"checkpoint step {step}")
    self._deadlines.append(cancel)
    with self._lock:
      self._unhashed.add(step)
    try:
      self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                      meta=ocp.args.JsonSave(meta)), force=True)
    except Exception as e:  # noqa: BLE001 - Orbax re-raises the previous save's error here, or its own
      self._fail(step, e)  # the deadline stays: the run must be gone by then, however its cleanup goes
      self.check()
    # Wait for the commit and hash from a background thread, so a checksum never stalls a train step.
    # (Orbax's post_finalization_callback runs before the tmp folder is renamed.)
    thread = threading.Thread(target=self._finish, args=(step, cancel), daemon=True, name=f"ckpt-finish-{step}")
    self._finishing.append(thread)
    thread.start()

  def deadline(self, what: str) -> Callable[[], bool]:
    """Ends the process with one line unless the returned `cancel()` is called within `timeout_s`."""
    # Several processes: Orbax's saves meet at barriers, so one process's failed save is a hang for all.
    others = ", or a save failed on another process" if jax.process_count() > 1 else ""
    return watchdog.exit_after(
        self.timeout_s, lambda: f"train: error: {what} was not saved to {self.directory} within "
        f"{self.timeout_s:g}s (config.checkpoint_timeout_s): the disk or bucket does not answer{others}; "
        f"stopped. {self._resume_hint()}", name=f"deadline {what}")

  def _resume_hint(self) -> str:
    if self.last_good is None:
      return "No checkpoint was finished: rerunning the same command starts the run again"
    return f"Rerunning the same command resumes from step {self.last_good}, the last finished checkpoint"

  def _fail(self, step: int | None, error: BaseException | str) -> None:
    with self._lock:
      if self._failed is None:
        why = error if isinstance(error, str) else _first_line(error)
        what = "a checkpoint" if step is None else f"checkpoint step {step}"
        self._failed = (f"{what} could not be saved to {self.directory} ({why}); stopped. "
                        f"{self._resume_hint()}")

  def check(self, all_processes: bool = False) -> None:
    """Raises CheckpointSaveError if a save failed (with `all_processes`: on any process; every process must
    call it at the same step)."""
    failed = self._failed
    if all_processes and jax.process_count() > 1 and distributed.any_process(failed is not None):
      failed = failed or "a checkpoint save failed on another process; stopped (its log says why)"
    if failed is not None:
      raise CheckpointSaveError(failed)

  def _finish(self, step: int, cancel: Callable[[], bool], poll_s: float = 0.05) -> None:
    """Waits until Orbax is done with `step`, then (process 0) writes its checksum; a failure is recorded
    for `check()`. A save that hangs, or a run that does not stop after a failure, is ended by the deadline."""
    step_dir = storage.join(self.directory, str(step))
    if storage.is_remote(self.directory):
      poll_s = max(poll_s, 0.5)  # each poll of a bucket is a request
    try:
      # Done when Orbax's save has ended, or (the next save may have begun meanwhile) the step is committed.
      while self.manager.is_saving_in_progress() and not _committed(step_dir):
        time.sleep(poll_s)
      if _is_main() and not self.read_only:
        self._write_checksums()
        if step in self._unhashed and self._collected(step):
          with self._lock:  # max_to_keep dropped it once a newer step was committed (keep_checkpoints=1)
            self._unhashed.discard(step)
          cancel()
          return
        if step in self._unhashed:  # Orbax finished without committing it: its error was logged, not raised
          try:
            self.manager.check_for_errors()
            why = "Orbax did not commit it"
          except Exception as e:  # noqa: BLE001
            why = _first_line(e)
          self._fail(step, why)
          return
      with self._lock:
        self._unhashed.discard(step)
        self.last_good = step if self.last_good is None else max(self.last_good, step)
      cancel()  # only now: after a failure the deadline still bounds the stop (a cleanup that hangs)
    except Exception as e:  # noqa: BLE001 - a disk or bucket error: the run stops at its next step
      self._fail(step, e)

  def _collected(self, step: int) -> bool:
    """`step` is gone and a newer step is committed: garbage-collected by `max_to_keep`, not a failed save."""
    if storage.exists(storage.join(self.directory, str(step))):
      return False
    newer = [int(n) for n in storage.listdir(self.directory) if n.isdigit() and int(n) > step]
    return any(_committed(storage.join(self.directory, str(n))) for n in newer)

  def _write_checksums(self) -> None:
    """Writes checksums/<step>.json for finalized steps saved by this run; drops those of collected steps."""
    if not _is_main() or self.read_only:
      return
    with self._lock:
      storage.makedirs(self.checksum_dir)
      kind = _digest_kind(self.directory)
      for step in sorted(self._unhashed):
        step_dir = storage.join(self.directory, str(step))
        if not _committed(step_dir):
          continue  # not finalized yet (or already garbage-collected); a later callback handles it
        storage.write_json(storage.join(self.checksum_dir, f"{step}.json"),
                           {"step": step, kind: storage.tree_digests(step_dir, kind)})
        self._unhashed.discard(step)
      for name in storage.listdir(self.checksum_dir):
        stem = name.split(".")[0]
        if stem.isdigit() and not storage.isdir(storage.join(self.directory, stem)):
          storage.remove(storage.join(self.checksum_dir, name))  # step removed by max_to_keep

  def wait(self) -> None:
    """Blocks until the last save is on disk and checksummed; raises CheckpointSaveError if a save failed."""
    for thread in self._finishing:
      thread.join()  # each ends with its save, or its deadline ends the process
    self._finishing = []
    self.check()
    try:
      self.manager.wait_until_finished()
      self._write_checksums()  # and drops those of steps garbage-collected since
    except Exception as e:  # noqa: BLE001 - as in _finish
      self._fail(max(self._unhashed, default=None), e)
      self.check()

  def close(self, raise_error: bool = True) -> None:
    """`wait()`, then closes Orbax; with `raise_error=False` (while another exception unwinds the loop) a
    failed save is left for `check()` and Orbax, which would raise it again, is not waited for. The last
    thing a run does with its checkpoints: a failed save's deadline, which bounded the run's cleanup until
    here, is cancelled (a notebook that trained in-process lives on)."""
    try:
      self.wait()
    except CheckpointSaveError:
      if raise_error:
        raise
      return
    else:
      self.manager.close()
    finally:
      for cancel in self._deadlines:
        cancel()
      self._deadlines = []

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
