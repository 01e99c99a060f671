"""What a model spec names, as paths: `ResolvedModel`, the answer of `pretrained.resolve_model` and the
question `loaded.load_model` answers (a room of its own so that both can import it)."""
from __future__ import annotations

import dataclasses
import os

from elmo_jax.runtime.run_layout import CONFIG_FILE, EXPORT_DIR, LEXICON_DIR, VOCAB_COUNTS_FILE, VOCAB_FILE

# At most this many files are listed of one model folder (a model is a handful; a user's big folder given as
# one is not walked to its end).
MAX_LISTED = 10_000


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
  """What a model spec names, as paths (`resolve_model`); None where the spec has no such part.

  Attributes:
    options_file, weight_file: the ELMo pair (None for a run with checkpoints only, so far).
    vocab_file: the vocabulary of the weights' softmax where there is one: a run's vocab.txt (`init_from`:
      the vocab.txt beside the weights).
    workdir: a training run's folder (of a bucket run: the local copy of `run_layout.RUN_FILES`).
    checkpoints: (checkpoints folder, step or None = the newest) of a run, its checkpoints/ or one step; a
      bucket run's stay in the bucket (Orbax reads them there).
    path: the spec as a path: a name or URL as given, a local path user-expanded (`init_from`: absolute), a
      bucket one as given (`init_from` ELMo files there: their local copy).
    tfhub_dir: a TF-Hub `elmo/3`-layout module folder (`formats/tfhub.py`; no options or weight file then).
    efml_dir: an ELMoForManyLangs model folder (`formats/efml.py`; options_file, weight_file: its config.json
      and encoder.pkl).
    folder_dir: elmo_jax's own model folder (`formats/model_folder.py`: config.json + model.safetensors; no
      options or weight file then).
  """
  options_file: str | None = None
  weight_file: str | None = None
  vocab_file: str | None = None
  workdir: str | None = None
  checkpoints: tuple[str, int | None] | None = None
  path: str | None = None
  tfhub_dir: str | None = None
  efml_dir: str | None = None
  folder_dir: str | None = None

  @property
  def files(self) -> tuple[str, str]:
    """(options_file, weight_file)."""
    return self.options_file, self.weight_file  # type: ignore[return-value]

  @property
  def read_files(self) -> tuple[str, ...]:
    """Every local file a load of it reads, or that its model folder holds, found from the names alone (nothing
    loaded or downloaded), absolute: the options, weight and vocabulary files; every file of an EFML folder
    (config.json, the architecture JSON, char.dic, word.dic, the pickles), of a TF-Hub module (its index and
    data shards) or of a model folder (config.json, model.safetensors, its lexicons, vocab.txt, README.md); a
    run's export/, lexicon/, config.json and vocabulary. What no writer may overwrite: the
    embed command's output, a run's workdir, `convert --to`, evaluation outputs (`LoadedModel.input_files`)."""
    named = [self.options_file, self.weight_file, self.vocab_file]
    if self.weight_file:  # the softmax's words beside the weights (`load_model` reads them), and their counts
      named += [os.path.join(os.path.dirname(self.weight_file), n) for n in (VOCAB_FILE, VOCAB_COUNTS_FILE)]
    folders = [self.efml_dir, self.tfhub_dir, self.folder_dir]
    if self.workdir is not None:
      named += [os.path.join(self.workdir, n) for n in (CONFIG_FILE, VOCAB_COUNTS_FILE)]
      folders += [os.path.join(self.workdir, EXPORT_DIR), os.path.join(self.workdir, LEXICON_DIR)]
    for folder in folders:
      named += folder_files(folder) if folder else []
    return tuple(dict.fromkeys(os.path.abspath(p) for p in named if p and os.path.isfile(p)))

  def checked(self) -> "ResolvedModel":
    """Itself, once a run's export is there to load (FileNotFoundError, one line, if not)."""
    if self.workdir is not None and self.options_file is not None:
      for path in self.files:
        if not os.path.exists(path):
          raise FileNotFoundError(f"{path}: not found (has {self.workdir} finished a checkpoint?)")
    return self


def folder_files(folder: str) -> list[str]:
  """The files under a local `folder` (links to files included), at most MAX_LISTED; [] if it is none."""
  out = []
  for top, dirs, names in os.walk(folder):
    dirs.sort()
    out += [os.path.join(top, n) for n in sorted(names)]
    if len(out) >= MAX_LISTED:
      return out[:MAX_LISTED]
  return out
