"""Checks a training run's inputs before anything is written: one line per mistake, nothing half-made.

`check(config, workdir)` runs in the entry point before JAX starts; it refuses what would otherwise end
in a traceback (or, worse, in a workdir holding a config.json and vocab of a run that never started).
"""
from __future__ import annotations

import gzip
import os

import ml_collections

from elmo_jax.data.sources import expand_paths

_SNIFF_BYTES = 1 << 20


class PreflightError(ValueError):
  """A config or workdir that cannot start a run; the message is one line naming the key or file."""


def check(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Raises PreflightError for a bad workdir, step/batch counts, data files or saved vocabulary."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise PreflightError(f"--workdir={workdir} is a file, not a directory")
  for key in ("batch_size", "unroll_steps", "num_train_steps", "log_every_steps", "eval_every_steps",
              "checkpoint_every_steps"):
    value = config.get(key)
    if isinstance(value, int) and value < 1:
      what = "nothing would be trained" if key == "num_train_steps" else "it must be >= 1"
      raise PreflightError(f"config.{key}={value}: {what}")
  data = config.data
  if data.get("prepared_dir"):
    check_prepared_dir("config.data.prepared_dir", data.prepared_dir)
    if data.get("prepared_eval_dir"):
      check_prepared_dir("config.data.prepared_eval_dir", data.prepared_eval_dir)
  elif not data.get("tfds_name"):
    if not data.train_files:
      raise PreflightError("config.data.train_files is empty and config.data.tfds_name is not set: "
                           "no training data")
    check_text_files("config.data.train_files", data.train_files)
    if data.eval_files:
      check_text_files("config.data.eval_files", data.eval_files)
  if data.get("vocab_file"):
    check_vocab(data.vocab_file, "config.data.vocab_file")
  saved = os.path.join(workdir, "vocab.txt")
  if os.path.exists(saved):
    check_vocab(saved, "the workdir's vocabulary (resume)")


def check_devices(config: ml_collections.ConfigDict, n_devices: int) -> None:
  """The global batch splits evenly over the devices (checked once JAX knows them)."""
  if config.batch_size % n_devices:
    raise PreflightError(f"config.batch_size={config.batch_size} must be divisible by the {n_devices} devices "
                         f"(e.g. --config.batch_size={-(-config.batch_size // n_devices) * n_devices})")


def check_text_files(key: str, value: str) -> list[str]:
  """Every comma-separated path/glob of `value` names files holding at least one non-blank line."""
  try:
    paths = expand_paths([p.strip() for p in value.split(",") if p.strip()])
  except (FileNotFoundError, ValueError) as e:
    raise PreflightError(f"{key}: {e}") from None
  for path in paths:
    if _blank(path):
      raise PreflightError(f"{key}: {path} is empty (no non-blank line)")
  return paths


def check_prepared_dir(key: str, path: str) -> None:
  """`path` is a directory made by `python -m elmo_jax.data.prepare` (it holds manifest.json)."""
  if not os.path.isfile(os.path.join(path, "manifest.json")):
    raise PreflightError(f"{key}={path} is not a prepared corpus (no manifest.json); make one with "
                         "`python -m elmo_jax.data.prepare`")


def _blank(path: str) -> bool:
  """True when the file holds only whitespace (read up to 1 MiB; a longer file counts as non-blank)."""
  if os.path.getsize(path) == 0:
    return True
  try:
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
      head = f.read(_SNIFF_BYTES)
  except (OSError, EOFError) as e:
    raise PreflightError(f"{path}: cannot read ({e})") from None
  return len(head) < _SNIFF_BYTES and not head.strip()


def check_vocab(path: str, what: str) -> None:
  """The vocabulary loads: specials present, no blank lines, counts (if any) match the tokens."""
  from elmo_jax.data import Vocab  # pylint: disable=g-import-not-at-top
  try:
    Vocab.load(path)
  except (OSError, ValueError, UnicodeDecodeError) as e:
    raise PreflightError(f"{what}: {e}") from None
