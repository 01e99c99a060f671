"""Trains an ELMo biLM.

  python train.py --workdir=runs/default --config=configs/default.py [--config.key=value ...]

Re-running the same command resumes from the newest good checkpoint in --workdir. SIGTERM / Ctrl-C finish
the current step, save and exit 0. Multi-process (TPU pod, several GPU hosts, or processes on one machine):
every process runs the same command; on TPU pods and SLURM `--distributed=auto` finds the cluster itself,
elsewhere pass --coordinator_address=HOST:PORT --num_processes=N --process_id=I.
"""
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from elmo_jax.training import distributed
from elmo_jax.training.config import unknown_override_error

FLAGS = flags.FLAGS
if (_error := unknown_override_error(sys.argv, "configs/default.py")) is not None:
  sys.exit(f"FATAL Flags parsing error: {_error}")  # instead of config_flags' traceback
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, vocab and the exported model.")
config_flags.DEFINE_config_file("config", "configs/default.py", "Training config (a configs/*.py file).",
                                lock_config=True)
flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                  "Call jax.distributed.initialize: 'auto' when --coordinator_address is given or a cluster "
                  "(TPU pod, SLURM, Open MPI) is detected; 'on' always (JAX detects the cluster); 'off' never.")
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0's coordinator (multi-process runs).")
flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  # Before anything touches a JAX backend: initialize() must come first in every process.
  distributed.initialize(FLAGS.distributed, FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  from elmo_jax.training.loop import train_and_evaluate
  train_and_evaluate(FLAGS.config, FLAGS.workdir)
  _exit_without_finalization()


def _exit_without_finalization() -> None:
  """Exits 0 once everything is saved and closed, skipping interpreter finalization.

  Finalization can race native threads of tensorstore/Orbax calling back into Python, which aborts the
  process ("terminate called after throwing an instance of ''", exit -6) after a successful run.
  """
  import jax
  if jax.process_count() > 1:
    jax.distributed.shutdown()  # the atexit hook that would do it is skipped too
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


if __name__ == "__main__":
  app.run(main)
