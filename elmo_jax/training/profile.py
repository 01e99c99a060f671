"""A jax.profiler trace of chosen train steps (`config.profile_steps="START:COUNT"`), for TensorBoard's profile
plugin or Perfetto.

The trace starts just before step START is dispatched and stops once step START+COUNT-1 has finished on the
devices. Before it starts, the steps still in flight are waited for and step START's program is compiled (a
cache hit unless it is the run's first step or a new table-size bucket), so the trace holds these steps'
device work and no compile. Nothing the run saves depends on it: steps, losses, checkpoints and resume are
those of a run without it; only the tokens/s of the log windows it touches feel the waits and the tracing.

Files (jax's layout): `<profile_dir>/plugins/profile/<time>/<host>.xplane.pb` (TensorBoard:
`tensorboard --logdir <profile_dir>`, Profile tab) and `perfetto_trace.json.gz` beside it (ui.perfetto.dev).
A gs:// profile_dir is written to a local staging folder and uploaded when the trace stops
(`storage.staged_output`). With `profile_all_processes` and several processes each writes
`<profile_dir>/process_<i>/`.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Callable

import jax

from elmo_jax.runtime import log, storage
from elmo_jax.runtime.run_layout import PROFILE_DIR


class ProfileStepsError(ValueError):
  """A `config.profile_steps` that names no steps; one line."""


def parse_steps(text: Any) -> tuple[int, int] | None:
  """(START, COUNT) of "START:COUNT" (both >= 1; steps count from 1, as the log does); None for ""."""
  if text is None or (isinstance(text, str) and not text.strip()):
    return None
  m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text) if isinstance(text, str) else None
  if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
    raise ProfileStepsError(f"config.profile_steps={text!r}: expected START:COUNT with START >= 1 and COUNT >= 1 "
                            "(e.g. '10:3' traces steps 10-12), or '' for none")
  return int(m.group(1)), int(m.group(2))


def profile_dir(config, workdir: str) -> str:
  """Where the trace goes: `config.profile_dir`, else `<workdir>/profile` (a bucket workdir: in the bucket)."""
  return config.profile_dir or storage.join(workdir, PROFILE_DIR)


class Profiler:
  """The trace of one run (`train_and_evaluate`): `before(step, ...)` / `after(step, ...)` around every step,
  `close()` when the loop ends however it ends. Inactive (costs nothing) when profile_steps is off, names
  steps this run does not run (one line says so), or this process does not profile."""

  def __init__(self, config, workdir: str, start_step: int, last: int):
    self._range: tuple[int, int] | None = None
    self._stack: contextlib.ExitStack | None = None
    self._annotation = None
    parsed = parse_steps(config.profile_steps)
    if parsed is None:
      return
    start, count = parsed
    end = start + count - 1
    what = f"config.profile_steps={config.profile_steps!r}"
    if end <= start_step:
      log.info(f"{what}: steps {start}-{end} ran before this run's first step ({start_step + 1}, resumed); "
               "no profile captured")
      return
    if start > last:
      log.info(f"{what}: step {start} is after the last step ({last}); no profile captured")
      return
    if not (jax.process_index() == 0 or config.profile_all_processes):
      return
    self._range = (max(start, start_step + 1), min(end, last))
    self._dir = profile_dir(config, workdir)
    if config.profile_all_processes and jax.process_count() > 1:  # processes on one host: one <host>.xplane.pb
      self._dir = storage.join(self._dir, f"process_{jax.process_index()}")

  def before(self, step: int, compile_step: Callable[[], Any], drain: Callable[[], None]) -> None:
    """Before 1-based `step` is dispatched: at the first traced step, compile it and wait for the steps in
    flight (`drain`), then start the trace; inside the range, open the step's trace annotation."""
    if self._range is None or not self._range[0] <= step <= self._range[1]:
      return
    if step == self._range[0]:
      compile_step()
      drain()
      stack = contextlib.ExitStack()
      try:
        self._local = stack.enter_context(storage.staged_output(self._dir, "config.profile_dir", directory=True))
        os.makedirs(self._local, exist_ok=True)
        jax.profiler.start_trace(self._local, create_perfetto_trace=True)
      except (OSError, ValueError, RuntimeError) as e:  # a diagnostic: never the end of the run
        stack.__exit__(type(e), e, e.__traceback__)  # nothing staged is uploaded
        self._range = None
        log.info(f"warning: no profile: {self._dir} cannot be written ({' '.join(str(e).split())[:200]}); the "
                 "run goes on without it", all_processes=True)
        return
      self._stack = stack  # a trace runs: close() stops it whatever happens next
    self._traced_to = step
    # Step boundaries for the profile plugin's step-time view.
    self._annotation = jax.profiler.StepTraceAnnotation("train", step_num=step)
    self._annotation.__enter__()

  def after(self, step: int, drain: Callable[[], None]) -> None:
    """After `step` was dispatched (and logged, evaluated, saved): at the last traced step, wait for it on
    the devices and write the trace."""
    if self._annotation is not None:
      self._annotation.__exit__(None, None, None)
      self._annotation = None
    if self._range is not None and step == self._range[1] and self._stack is not None:
      drain()
      self._stop(raise_error=True)

  def close(self) -> None:
    """Stops a trace the loop left running (an error, a stop request): what it holds is written."""
    if self._annotation is not None:
      self._annotation.__exit__(None, None, None)
      self._annotation = None
    if self._stack is not None:
      self._stop(raise_error=False)

  def _stop(self, raise_error: bool) -> None:  # pylint: disable=unused-argument
    """Stops the trace and writes it; a trace that cannot be written (a full or read-only disk, a refused
    upload) is a warning, never the end of the run, and is never reported as written."""
    stack, self._stack = self._stack, None
    try:
      jax.profiler.stop_trace()
      runs = os.path.join(self._local, "plugins", "profile")
      newest = max(os.listdir(runs), default="") if os.path.isdir(runs) else ""
      if not newest or not any(n.endswith(".xplane.pb") for n in os.listdir(os.path.join(runs, newest))):
        raise OSError(f"no trace file in {runs}")
    except (OSError, RuntimeError, ValueError) as e:
      stack.__exit__(type(e), e, e.__traceback__)  # nothing staged is uploaded
      log.info(f"warning: the profile could not be written to {self._dir} ({' '.join(str(e).split())[:200]}); "
               "the run goes on", all_processes=True)
      return
    try:
      stack.close()  # a bucket profile_dir: uploaded here
    except (storage.StorageError, OSError) as e:
      log.info(f"warning: the profile could not be uploaded to {self._dir} ({e}); the run goes on",
               all_processes=True)
      return
    first, last = self._range[0], self._traced_to
    where = storage.join(self._dir, "plugins", "profile", newest)
    log.info(f"step {last}: profile of steps {first}-{last} written to {where} (tensorboard --logdir "
             f"{self._dir}: Profile tab; or perfetto_trace.json.gz at ui.perfetto.dev)", all_processes=True)
