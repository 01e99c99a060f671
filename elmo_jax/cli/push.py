"""The push command (`elmo-jax push`): a safetensors model folder uploaded to a Hugging Face Hub repository.

    elmo-jax convert --format=safetensors --from=small --to=elmo_small/
    elmo-jax push --to=hf://owner/elmo-small elmo_small/

The folder must be elmo_jax's own (`convert --format=safetensors`: config.json, model.safetensors, its model card
README.md, and the lexicons or vocab.txt it has) and must load: it is read and checked before anything is
sent, and only the files its loader reads and its card are sent (regular files inside the folder: no symlink,
no dotfile, no stray; the list is shown first); the repository's other files (an older model's) are deleted in
the same commit. The repository is created private if it is missing (`--public`: public); the token is `HF_TOKEN`'s or huggingface_hub's stored login
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
from elmo_jax.sources import resolve

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("to", None, "The repository: hf://owner/name (or hf://owner/name@branch).")
  flags.DEFINE_string("message", None, "The commit message (default: 'elmo-jax push FOLDER').")
  flags.DEFINE_bool("public", False, "Create a missing repository public (default: private).")


def check_folder(folder: str) -> list[str]:
  """Refuses (HubError, one line) a folder that is not a loadable safetensors model folder with its card;
  returns what a push publishes: the files its loader read (`LoadedModel.files`: config.json, model.safetensors,
  the lexicons; its vocab.txt) and the card, each a regular file inside the folder (`hub.publishable`)."""
  if not os.path.isdir(folder) or not model_folder.is_folder(folder):
    raise hub.HubError(f"{folder}: not a safetensors model folder (config.json + model.safetensors); write one "
                       f"with elmo-jax convert --format=safetensors --from=MODEL --to={folder}")
  if not os.path.isfile(os.path.join(folder, model_folder.CARD)):
    raise hub.HubError(f"{folder}: holds no {model_folder.CARD} (the model card convert writes)")
  # As every reader of a model: the resolver (its own folder is preferred there), then the one load; absolute, so
  # that a folder named as a released model is still the folder.
  model = loaded.load_model(resolve.resolve_model(os.path.abspath(folder)))
  read = [*model.files, *([model.vocab_file] if model.vocab_file else [])]
  return hub.publishable(folder, [*read, os.path.join(folder, model_folder.CARD)])


def _all_files(folder: str) -> list[str]:
  """Every name under `folder` (relative, `/`-separated), links included: what is shown as left out."""
  out = []
  for top, dirs, names in os.walk(folder):
    linked_dirs = [name for name in dirs if os.path.islink(os.path.join(top, name))]  # os.walk does not enter them
    out += [os.path.relpath(os.path.join(top, name), folder).replace(os.sep, "/") for name in names + linked_dirs]
  return out


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    raise app.UsageError("give one folder to push: elmo-jax push --to=hf://owner/name FOLDER")
  if not FLAGS.to:
    raise app.UsageError("--to is required")
  folder = argv[1]
  try:
    hub.parse(FLAGS.to)
    names = check_folder(folder)
    others = sorted(set(_all_files(folder)) - set(names))
    print(f"pushing {len(names)} files to {FLAGS.to} ({'public' if FLAGS.public else 'private'} if new): "
          f"{', '.join(names)}" + (f"; not the model's, not pushed: {', '.join(others)}" if others else ""),
          file=sys.stderr, flush=True)
    pushed = hub.push(folder, FLAGS.to, names, FLAGS.message, public=FLAGS.public)
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
