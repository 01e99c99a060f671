"""Trains an ELMo biLM.

  elmo-jax train --workdir=runs/default --config=configs/default.py [--config.key=value ...]
  elmo-jax train --workdir=runs/default --config=configs/default.py     # the installed console script

Re-running the same command resumes from the newest good checkpoint in --workdir. SIGTERM / Ctrl-C finish
the current step, save and exit 0. Multi-process (TPU pod, several GPU hosts, or processes on one machine):
every process runs the same command; on TPU pods and SLURM `--distributed=auto` finds the cluster itself,
elsewhere pass --coordinator_address=HOST:PORT --num_processes=N --process_id=I.
"""
import functools
import logging as std_logging
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from elmo_jax import cli
from elmo_jax.data.prepare import PrepareError
from elmo_jax.formats.options import OptionsError
from elmo_jax.runtime import devices
from elmo_jax.runtime import distributed
from elmo_jax.runtime import progress
from elmo_jax.runtime.storage import StorageError
from elmo_jax.sources.download import DownloadError
from elmo_jax.training import preflight
from elmo_jax.training import variant
from elmo_jax.training.checkpoint import CheckpointSaveError, IncompatibleCheckpointError
from elmo_jax.training.config import config_file_error, unknown_override_error
from elmo_jax.training.init_from import InitFromError
from elmo_jax.training.lock import WorkdirLock, WorkdirLocked
from elmo_jax.training.loop import train_and_evaluate

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the flags (at run time, so importing this module adds none)."""
  default = cli.default_config()
  if (error := config_file_error(sys.argv, default) or unknown_override_error(sys.argv, default)) is not None:
    sys.exit(f"FATAL Flags parsing error: {error}")  # instead of config_flags' traceback
  flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, vocab and the exported model; a "
                      "bucket URL (gs://bucket/run) on a TPU pod.")
  config_flags.DEFINE_config_file("config", default, "Training config (a configs/*.py file).", lock_config=True)
  cli.define_distributed_flags()
  flags.DEFINE_bool("progress", True, "Progress bars on stderr (--noprogress: none; off anyway when stderr "
                    "is not a terminal).")
  flags.mark_flags_as_required(["workdir"])


def main(argv, after_step=None):
  """`train.py`; `after_step(step, flush)` is `train_and_evaluate`'s hook (the fault tests' `tests/signal_train.py`)."""
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  # and a failed save as tracebacks from its threads; the run says it in one line (CheckpointSaveError)
  std_logging.getLogger("absl").addFilter(_no_orbax_tracebacks)
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not FLAGS.progress:
    progress.set_enabled(False)
  try:  # a user's mistake is refused in one line, before anything is written (also by the checks below)
    config = variant.resolve(FLAGS.config, FLAGS.workdir)  # the model's options, lexicons, export format
    preflight.check(config, FLAGS.workdir)
  except (preflight.PreflightError, StorageError, InitFromError, OptionsError) as e:
    sys.exit(f"train: error: {e}")
  # Before anything touches a JAX backend: initialize() must come first in every process.
  try:
    distributed.initialize(FLAGS.distributed, FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                           FLAGS.distributed_timeout_s)
  except ValueError as e:  # e.g. --coordinator_address without --num_processes
    sys.exit(f"train: error: {e}")
  devices.announce()
  try:
    import jax  # pylint: disable=g-import-not-at-top
    preflight.check_run(config, FLAGS.workdir, jax.device_count(), jax.process_count())
  except (preflight.PreflightError, StorageError) as e:
    sys.exit(f"train: error: {e}")
  lock, error = None, "process 0 could not lock the workdir: another trainer holds it"
  try:
    lock = WorkdirLock.acquire(FLAGS.workdir)
  except (WorkdirLocked, StorageError) as e:
    error = str(e)
  if not _all_agree(lock is not None):  # every process stops when process 0 is refused
    sys.exit(f"train: error: {error}")
  failure = None
  try:
    train_and_evaluate(config, FLAGS.workdir, after_step=after_step)
  except KeyboardInterrupt:  # before the step loop (which saves on Ctrl-C), e.g. while preparing the corpus
    lock.release()
    sys.stderr.write("train: interrupted; rerunning the same command resumes\n")
    os._exit(130)  # skips finalization, as a finished run does (see _exit_without_finalization)
  except _user_errors() as e:
    failure = f"train: error: {str(e).splitlines()[0]}"
  finally:
    if lock is not None:
      lock.release()
  _exit_without_finalization(failure)


def _no_orbax_tracebacks(record: std_logging.LogRecord) -> bool:
  return not ((record.exc_info or record.levelno >= std_logging.ERROR)
              and f"{os.sep}orbax{os.sep}" in (record.pathname or ""))


def _user_errors() -> tuple[type[BaseException], ...]:
  """Errors whose message is the whole story (a file, a key, a checkpoint of another run): no traceback."""
  return (IncompatibleCheckpointError, CheckpointSaveError, PrepareError, InitFromError, OptionsError,
          DownloadError, StorageError)


def _all_agree(ok: bool) -> bool:
  """Process 0's `ok`, on every process (only process 0 takes the workdir lock)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return ok
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(multihost_utils.broadcast_one_to_all(np.array(ok)))


def _exit_without_finalization(error: str | None = None) -> None:
  """Exits 0 once everything is saved and closed, or 1 after writing `error`, skipping interpreter finalization.

  Finalization can race native threads of tensorstore/Orbax calling back into Python, which aborts the
  process ("terminate called after throwing an instance of ''", exit -6) after a successful run; after a
  failed save it waits forever for Orbax's threads.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1 and error is None:
    jax.distributed.shutdown()  # the atexit hook that would do it is skipped too
  if error is not None:
    print(error, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0 if error is None else 1)


def run(after_step=None) -> None:
  cli.run_main(main if after_step is None else functools.partial(main, after_step=after_step), define_flags)


if __name__ == "__main__":
  run()
