"""What a model spec names, as paths: `ResolvedModel`, the answer of `pretrained.resolve_model` and the
question `loaded.load_model` answers (a room of its own so that both can import it)."""
from __future__ import annotations

import dataclasses
import os


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
    tfhub_dir: a TF-Hub `elmo/3`-layout module folder (`interop/tfhub.py`; no options or weight file then).
    efml_dir: an ELMoForManyLangs model folder (`interop/efml.py`; options_file, weight_file: its config.json
      and encoder.pkl).
  """
  options_file: str | None = None
  weight_file: str | None = None
  vocab_file: str | None = None
  workdir: str | None = None
  checkpoints: tuple[str, int | None] | None = None
  path: str | None = None
  tfhub_dir: str | None = None
  efml_dir: str | None = None

  @property
  def files(self) -> tuple[str, str]:
    """(options_file, weight_file)."""
    return self.options_file, self.weight_file  # type: ignore[return-value]

  def checked(self) -> "ResolvedModel":
    """Itself, once a run's export is there to load (FileNotFoundError, one line, if not)."""
    if self.workdir is not None and self.options_file is not None:
      for path in self.files:
        if not os.path.exists(path):
          raise FileNotFoundError(f"{path}: not found (has {self.workdir} finished a checkpoint?)")
    return self
