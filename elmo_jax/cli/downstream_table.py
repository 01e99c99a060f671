"""The settings side by side (`elmo-jax downstream table`): test accuracy per task x ELMo setting, mean ± std over
seeds.

  elmo-jax downstream table runs/pos-none-s0 runs/pos-frozen-s* ... --output=runs/summary

Each argument is a results.json, a run directory holding one, or a directory searched recursively for
them. Prints a markdown table; with --output writes OUTPUT/downstream.md and OUTPUT/downstream.json (the
summary the notebook and `plots.settings_bars` read). std is the sample standard deviation over seeds
(ddof=1; 0 for one seed).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Sequence

from absl import flags

from elmo_jax import cli
from elmo_jax.downstream.table import find_results, markdown, summarise
from elmo_jax.runtime import files
from elmo_jax.runtime import storage

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the command's flags; only when run as a command (`cli.run_main`), so importing it adds none."""
  flags.DEFINE_string("output", None, "Directory for downstream.md and downstream.json.")


def main(argv: Sequence[str]) -> None:
  if len(argv) < 2:
    sys.exit("elmo_jax downstream table: give RUN_DIR or results.json paths")
  try:
    paths = find_results(argv[1:])
    results = []
    for path in paths:
      with open(path, encoding="utf-8") as f:
        try:
          results.append(json.load(f))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
  except (OSError, ValueError) as e:
    sys.exit(f"elmo_jax downstream table: error: {e}")
  if FLAGS.output:  # before any work is shown: an output that would replace a results.json is refused
    try:
      storage.check_output(FLAGS.output, "--output", inputs=paths, directory=True)
      if os.path.isdir(FLAGS.output):
        for name in ("downstream.md", "downstream.json"):
          storage.check_output(os.path.join(FLAGS.output, name), "--output", inputs=paths)
    except files.UnsafeOutputError as e:
      sys.exit(f"elmo_jax downstream table: error: {e}")
  summary = summarise(results, paths)
  text = markdown(summary)
  print(text, end="")
  if FLAGS.output:
    files.write_text(os.path.join(FLAGS.output, "downstream.md"), text)
    files.write_json(os.path.join(FLAGS.output, "downstream.json"), summary)


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
