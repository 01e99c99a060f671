"""Trains an ELMo biLM.

  python train.py --workdir=runs/default --config=configs/default.py [--config.key=value ...]
"""
from absl import app, flags, logging
from ml_collections import config_flags

from elmo_jax.training.loop import train_and_evaluate

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, vocab and the exported model.")
config_flags.DEFINE_config_file("config", "configs/default.py", "Training config (a configs/*.py file).",
                                lock_config=True)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  app.run(main)
