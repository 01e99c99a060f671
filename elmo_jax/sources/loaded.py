"""The one load of a model: what `resolve.resolve_model` found (a `ResolvedModel`) -> a `LoadedModel`.

    found = resolve.resolve_model("small")         # which files a spec names (downloads once)
    model = loaded.load_model(found)               # options + BiLM params (+ softmax, vocab, mix, char ids)

Every loader goes through `load_model`: the Embedder (`from_model`, `from_files`, `from_efml`), `load_elmo` and
`pretrained.load`, conversion (`convert.load`), `config.init_from`'s ELMo files, `evaluate.py --model` and the
task models. Four formats are read (`READ_FORMATS`; what conversion writes: `convert.WRITE_FORMATS`): bilm-tf's options.json + weights.hdf5 (a run's export too), an
ELMoForManyLangs folder (`efml`: its char ids are `chars.LexiconIds`, not bilm-tf's bytes), a TF-Hub
`elmo/3`-layout module (`tfhub`: its learned mix) and elmo_jax's own folder (`safetensors`: config.json +
model.safetensors, any of the others' parts; `formats/model_folder.py`). Errors are the readers' own, one line
naming the file.
"""
from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import Any

import numpy as np

from elmo_jax.data import chars
from elmo_jax.formats import efml
from elmo_jax.formats import model_folder
from elmo_jax.formats import options as options_lib
from elmo_jax.formats import param_names
from elmo_jax.formats import safetensors
from elmo_jax.formats import tfhub
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime.run_layout import VOCAB_FILE
from elmo_jax.sources.resolve import ResolvedModel

BILM_HDF5, EFML, TFHUB, SAFETENSORS = "bilm-hdf5", "efml", "tfhub", "safetensors"
READ_FORMATS = (BILM_HDF5, EFML, TFHUB, SAFETENSORS)
_EFML_NOTE = ("options.json + weights.hdf5 has no place for its word embedding (word.dic's vectors beside the char "
              "CNN) nor for its char ids (char.dic)")


@dataclasses.dataclass(frozen=True)
class LoadedModel:
  """A model read into memory (numpy, on the host).

  Attributes:
    options: options.json's content (inferred for a TF-Hub module and an EFML folder).
    params: the `BiLM` params (float32 numpy).
    format: which of `READ_FORMATS` it was read from.
    files: every model file it was read from, the (options, weights) pair first where the format has one (what
      an output must never overwrite).
    softmax: the LM's softmax params where the weights hold one (bilm-hdf5), else None.
    vocab_file: the softmax's words: a run's vocab.txt, or the one beside the weights; None if none.
    mix: a TF-Hub module's learned `elmo` mix ({"weights": [n_layers + 1], "scaling": []}), else None.
    token_ids: an EFML folder's token -> char ids (`chars.LexiconIds`); None: bilm-tf's UTF-8 bytes.
    note: what bilm-tf's layout (options.json + weights.hdf5) cannot hold of it, in one line; None if nothing.
    source: what `resolve_model` found.
  """
  options: dict[str, Any]
  params: dict[str, Any]
  format: str
  files: tuple[str, ...]
  softmax: dict[str, Any] | None = None
  vocab_file: str | None = None
  mix: dict[str, np.ndarray] | None = None
  token_ids: chars.LexiconIds | None = None
  note: str | None = None
  source: ResolvedModel | None = None

  @property
  def input_files(self) -> tuple[str, ...]:
    """`files`, the vocabulary and every other file of its source (`ResolvedModel.read_files`: an EFML folder's
    architecture JSON, a TF-Hub module's shards, a run's lexicon/): everything an output must not overwrite."""
    named = (*self.files, self.vocab_file, *(self.source.read_files if self.source is not None else ()))
    return tuple(dict.fromkeys(p for p in named if p))


def load_model(found: ResolvedModel) -> LoadedModel:
  """Reads what `found` names: a TF-Hub module, an EFML folder, or an options.json + weights.hdf5 pair (a run's
  export: FileNotFoundError, one line, until it has one). Raises the readers' one-line errors
  (options.OptionsError, weights.WeightFileError, efml.EFMLError, tf_bundle.BundleError; a model folder's
  model_folder.FolderError and safetensors.SafetensorsError are WeightFileErrors); a weight that is NaN or
  infinite in any format is a WeightFileError naming it (a model of them answers NaN layers without a word), and
  so is a reader's MemoryError or zipfile.BadZipFile (a file that claims more than this machine holds, a torch
  file that is no zip), whichever reader meets it."""
  try:
    model = _read(found)
  except (MemoryError, zipfile.BadZipFile) as e:
    what = "needs more memory than this process can have" if isinstance(e, MemoryError) else "is a damaged zip"
    raise weights_lib.WeightFileError(f"{found.path or 'the model'}: reading it failed: it {what} "
                                      f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
  return _finite(model)


def read_options(found: ResolvedModel) -> dict[str, Any]:
  """What `found`'s model is (its options, validated), without its weights where the format keeps them apart
  (an options.json); a TF-Hub module's and an EFML folder's are inferred from their weights, so read whole.
  Raises the readers' one-line errors (options.OptionsError, FileNotFoundError, ...)."""
  if found.tfhub_dir is None and found.efml_dir is None and found.folder_dir is None:
    options_file = found.checked().options_file
    return options_lib.validate(options_lib.load(options_file), options_file)
  return load_model(found).options


def check_weights(found: ResolvedModel, options: dict[str, Any]) -> None:
  """What `load_model` would refuse of an hdf5 pair's weights (a missing dataset, one of another shape than
  `options` say), from the file's metadata alone; the other formats are checked by their load. Raises
  weights.WeightFileError, one line."""
  if found.tfhub_dir is None and found.efml_dir is None and found.folder_dir is None:
    weights_lib.check_hdf5(found.checked().weight_file, options)


def has_softmax(found: ResolvedModel) -> bool:
  """Whether `found`'s weights hold the LM's softmax, read off the weights' index alone (nothing loaded): an
  hdf5 pair's datasets, a model folder's safetensors header; a TF-Hub module and an EFML folder have none.
  Raises the readers' one-line WeightFileError for weights that are none."""
  if found.tfhub_dir is not None or found.efml_dir is not None:
    return False
  if found.folder_dir is not None:
    header = safetensors.read_header(os.path.join(found.folder_dir, model_folder.WEIGHTS))[0]
    return "softmax/W" in header and "softmax/b" in header
  return weights_lib.has_softmax(found.checked().weight_file)


def _finite(model: LoadedModel) -> LoadedModel:
  """`model` if every weight it holds is finite, else WeightFileError naming the first that is not."""
  for part, tree in (("bilm", model.params), ("softmax", model.softmax), ("mix", model.mix)):
    for name, value in param_names.flat(tree or {}, part).items():
      if not np.isfinite(value.sum(dtype=np.float64)):  # a float64 sum of float32s cannot overflow: only NaN/inf
        where = model.files[1] if len(model.files) > 1 and model.format == BILM_HDF5 else model.files[0]
        raise weights_lib.WeightFileError(f"{where}: the weight {name} holds NaN or infinite values (a damaged "
                                          "or diverged model)")
  return model


def _read(found: ResolvedModel) -> LoadedModel:
  if found.tfhub_dir is not None:
    return _tfhub(found)
  if found.efml_dir is not None:
    return _efml(found)
  if found.folder_dir is not None:
    return _folder(found)
  options_file, weight_file = found.checked().files
  options = options_lib.load(options_file)
  weights = weights_lib.load_hdf5(weight_file, options)
  beside = os.path.join(os.path.dirname(weight_file), VOCAB_FILE)  # the softmax's words, as a run exports them
  vocab = found.vocab_file or (beside if os.path.isfile(beside) else None)
  return LoadedModel(options, weights["params"], BILM_HDF5, (options_file, weight_file), softmax=weights["softmax"],
                     vocab_file=vocab, source=found)


def _tfhub(found: ResolvedModel) -> LoadedModel:
  module = tfhub.load(found.tfhub_dir)
  return LoadedModel(module.options, module.params, TFHUB, module.files, vocab_file=found.vocab_file,
                     mix=module.mix, note=_mix_note(module.mix), source=found)


def _mix_note(mix: dict[str, np.ndarray]) -> str:
  weights = ", ".join(f"{v:.9g}" for v in mix["weights"].tolist())
  return (f"the module's learned mix has no place in bilm-tf's layout and is not written: "
          f"aggregation/weights=[{weights}], aggregation/scaling={float(mix['scaling']):.9g}")


def _efml(found: ResolvedModel) -> LoadedModel:
  folder = found.efml_dir
  options, params, token_ids = efml.load(folder)
  paths = efml.model_files(folder)
  main = (efml.CONFIG, efml.ENCODER)  # what `resolve.resolve` names, first
  read = tuple(paths[k] for k in main if k in paths) + tuple(p for k, p in paths.items() if k not in main)
  return LoadedModel(options, params, EFML, read, token_ids=token_ids, note=_EFML_NOTE, source=found)


def _folder(found: ResolvedModel) -> LoadedModel:
  folder = model_folder.load(found.folder_dir)
  return LoadedModel(folder.options, folder.params, SAFETENSORS, folder.files, softmax=folder.softmax,
                     vocab_file=found.vocab_file or folder.vocab_file, mix=folder.mix, token_ids=folder.token_ids,
                     note=_mix_note(folder.mix) if folder.mix is not None else
                     _EFML_NOTE if folder.token_ids is not None else None, source=found)
