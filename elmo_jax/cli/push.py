"""The push command (`elmo-jax push`): a safetensors model folder uploaded to a Hugging Face Hub repository.

    elmo-jax convert --format=safetensors --from=small --to=elmo_small/
    elmo-jax push --to=hf://owner/elmo-small elmo_small/

The folder must be elmo_jax's own (`convert --format=safetensors`: config.json, model.safetensors, its model card
README.md, and the lexicons or vocab.txt it has) and must load: it is read and checked before anything is
sent. The repository is created if it is missing; the token is `HF_TOKEN`'s or huggingface_hub's stored login
(`hf auth login`). Prints `hf://owner/name@<commit>`, the pinned spec of what was pushed (`--model=` takes it).
Needs huggingface_hub (`pip install 'elmo_jax[hub]'`).
"""
from __future__ import annotations

import os
import sys

from absl import app
from absl import flags

from elmo_jax import cli
from elmo_jax.formats import model_folder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import weights as weights_lib
from elmo_jax.sources import hub
from elmo_jax.sources import loaded
from elmo_jax.sources.resolved import ResolvedModel

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("to", None, "The repository: hf://owner/name (or hf://owner/name@branch).")
  flags.DEFINE_string("message", None, "The commit message (default: 'elmo-jax push FOLDER').")


def check_folder(folder: str) -> None:
  """Refuses (HubError, one line) a folder that is not a loadable safetensors model folder with its card."""
  if not os.path.isdir(folder) or not model_folder.is_folder(folder):
    raise hub.HubError(f"{folder}: not a safetensors model folder (config.json + model.safetensors); write one "
                       f"with elmo-jax convert --format=safetensors --from=MODEL --to={folder}")
  if not os.path.isfile(os.path.join(folder, model_folder.CARD)):
    raise hub.HubError(f"{folder}: holds no {model_folder.CARD} (the model card convert writes)")
  loaded.load_model(ResolvedModel(path=folder, folder_dir=folder))


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    raise app.UsageError("give one folder to push: elmo-jax push --to=hf://owner/name FOLDER")
  if not FLAGS.to:
    raise app.UsageError("--to is required")
  folder = argv[1]
  try:
    hub.parse(FLAGS.to)
    check_folder(folder)
    pushed = hub.push(folder, FLAGS.to, FLAGS.message)
  except (hub.HubError, weights_lib.WeightFileError, options_lib.OptionsError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(pushed)
  print(f"pushed {folder} to {pushed}", file=sys.stderr)
  return 0


def run() -> None:
  cli.run_main(main, define_flags)


if __name__ == "__main__":
  run()
