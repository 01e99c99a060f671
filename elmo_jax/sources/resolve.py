"""Which model a spec means, as paths: `resolve_model` (the one reading of a name, URL, folder, archive, Hub
repository or run, for every reader of a model) and its answer, `ResolvedModel` (the question `loaded.load_model`
answers).

    found = resolve.resolve_model("small")          # downloads once, then works offline
    model = loaded.load_model(found)                # options, params, softmax, vocab, ...
"""
from __future__ import annotations

import dataclasses
import glob
import os
import urllib.parse

from elmo_jax.formats import efml
from elmo_jax.formats import model_folder
from elmo_jax.formats import tfhub
from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import (CHECKPOINTS, CONFIG_FILE, EXPORT_DIR, LEXICON_DIR, OPTIONS_FILE, RUN_FILES,
                                         VOCAB_COUNTS_FILE, VOCAB_FILE, WEIGHTS_FILE, export_files)
from elmo_jax.sources import archive
from elmo_jax.sources import download
from elmo_jax.sources import hub
from elmo_jax.sources.released import MODELS, Released

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


class SourceError(ValueError):
  """`use="init_from"`: the spec names no checkpoint or ELMo files; the message starts with the path."""


_INIT_FROM = ("a run's workdir, its checkpoints/ or a step, ELMo's options.json or weights .hdf5, or a folder "
              "of them")


def resolve_model(spec: str | os.PathLike, *, use: str = "model", fetch: bool = True) -> ResolvedModel:
  """The one reading of "which model does the user mean", for every loader.

  `spec` is, by `use`:
    "model": a local training run (a folder with export/), a released name (`MODELS`), a URL (`_url_pair`;
      a `file://` folder as a folder), a Hugging Face Hub repository (`hf://owner/name@revision`: `hub.fetch`, its
      snapshot read as the folder it is), a TF-Hub module folder (`tfhub.is_module`), a folder of
      options.json + weights.hdf5 (`_pair_in_folder`), or an archive's URL or path (`.zip`, `.tar.gz`, ...:
      `_from_archive`), elmo_jax's own folder (config.json + model.safetensors: `model_folder.is_folder`,
      preferred where a folder holds another model's files too);
    "bilm": as "model", and a local run with checkpoints but no export yet gives its checkpoints;
    "run": a training run's workdir, local or `gs://` (its `run_layout.RUN_FILES` then copied here);
    "init_from": a released name, a URL, then a run, its checkpoints/ or one step (local or `gs://`), else
      an options.json or .hdf5 file or a folder of them (`_elmo_files`; in a bucket: a local copy).
  `fetch=False`: the paths alone, nothing downloaded, copied or listed beyond a local folder (what an output
  must not overwrite, before any work): a released name's cache files, a run's files; nothing for a URL or
  what cannot be found.

  Raises (one line): download.DownloadError (a download, or nothing found), SourceError (`init_from`).
  `checked()` raises FileNotFoundError for a run that has not exported yet.
  """
  text = os.fspath(spec)
  if use == "run":
    return _run(text, fetch)
  path = os.path.expanduser(text)
  if use in ("model", "bilm") and os.path.isdir(os.path.join(path, EXPORT_DIR)):
    return _run(path, fetch)
  if use == "bilm" and os.path.isdir(os.path.join(path, CHECKPOINTS)):
    return ResolvedModel(workdir=path, checkpoints=(os.path.join(path, CHECKPOINTS), None), path=path)
  if text in MODELS:
    found = _released(MODELS[text], fetch)
  elif hub.is_hub_spec(text):  # a Hub repository: its snapshot folder, read as a local folder
    found = dataclasses.replace(resolve_model(hub.fetch(text), use=use), path=text) if fetch else ResolvedModel()
  elif storage.is_remote(text) and use in ("model", "bilm"):  # e.g. what `convert --to=gs://...` wrote
    found = _from_bucket(text, use) if fetch else ResolvedModel()
  elif archive.is_archive(text) and not os.path.isdir(path):  # a folder named `x.zip` is a folder
    found = _from_archive(text, use) if fetch else ResolvedModel()
  elif download.is_url(text):
    found = _from_url(text) if fetch else ResolvedModel()
  elif use == "init_from":
    found = _init_source(text)
  elif os.path.isdir(path) or efml.folder_problem(path) is not None:
    found = _local_folder(path, fetch)
  elif fetch:
    raise download.DownloadError(f"{text}: not a released model ({', '.join(MODELS)}), a folder or a URL")
  else:
    found = ResolvedModel()
  return _vocab_beside(found) if use == "init_from" else found


def _local_folder(path: str, fetch: bool) -> ResolvedModel:
  """A local folder's model: elmo_jax's own (preferred over any other model files beside it), a TF-Hub module,
  an ELMoForManyLangs folder, else an options.json + weights.hdf5 pair (`fetch=False`: what is there)."""
  if model_folder.is_folder(path):
    return ResolvedModel(path=path, folder_dir=path)
  if tfhub.is_module(path):
    _one_model_in(path)
    return ResolvedModel(path=path, tfhub_dir=path)
  if efml.folder_problem(path) is not None:
    raise download.DownloadError(efml.folder_problem(path))
  if efml.is_efml_dir(path):
    return efml_folder(path)
  try:
    return ResolvedModel(*_pair_in_folder(path), path=path)
  except download.DownloadError:
    if fetch:
      raise
    return ResolvedModel(path=path)  # loading it says what is missing


def resolve_files(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> ResolvedModel:
  """An explicit (options, weights) pair as `resolve_model` would give it: local paths, `file://` or `http(s)://`
  URLs (downloaded once, each checked to be an options.json and a readable HDF5 file), or an EFML folder's
  config.json and a .pkl (what `resolve` gives for one)."""
  options_file = os.fspath(options_file)
  weight_file = os.fspath(weight_file)
  folder = os.path.dirname(options_file)
  if weight_file.endswith(".pkl") and efml.is_efml_dir(folder):
    return ResolvedModel(options_file, weight_file, path=folder, efml_dir=folder)
  return ResolvedModel(download.cached_path(options_file, kind="options"),
                       download.cached_path(weight_file, kind="hdf5"), path=options_file)


def efml_folder(folder: str | os.PathLike) -> ResolvedModel:
  """An ELMoForManyLangs folder as `resolve_model` names it (`load_model` then reads it, or says why not)."""
  folder = os.fspath(folder)
  return ResolvedModel(os.path.join(folder, efml.CONFIG), os.path.join(folder, efml.ENCODER), path=folder,
                       efml_dir=folder)


def resolve(name_or_path: str) -> tuple[str, str]:
  """Local (options.json, weights.hdf5) of `resolve_model(name_or_path)`: a released name, a folder, a URL."""
  model = resolve_model(name_or_path)
  if model.tfhub_dir is not None or model.folder_dir is not None:
    kind = "a TF-Hub module" if model.tfhub_dir is not None else "a safetensors model folder"
    raise download.DownloadError(f"{name_or_path}: {kind} has no options.json + weights.hdf5; convert it "
                                 f"first: elmo-jax convert --from={name_or_path} --to=DIR")
  return model.checked().files


def _released(released: Released, fetch: bool) -> ResolvedModel:
  """The two files in the cache (downloaded once; checked against the recorded hash on every use)."""
  if not fetch:
    return ResolvedModel(download.local_path(released.options_url), download.local_path(released.weight_url),
                         path=released.name)
  return ResolvedModel(download.cached_path(released.options_url, released.options_sha256, kind="options"),
                       download.cached_path(released.weight_url, released.weights_sha256, kind="hdf5"),
                       path=released.name)


def _url_pair(url: str) -> tuple[str, str]:
  """A folder URL (ending in `/`: `options.json` and `weights.hdf5` inside) or the options file's, whose
  weights sit beside it with `options.json` -> `weights.hdf5` (AllenNLP's naming)."""
  if url.endswith("/"):
    return url + OPTIONS_FILE, url + WEIGHTS_FILE
  if urllib.parse.urlparse(url).path.endswith(OPTIONS_FILE):
    at = url.rindex(OPTIONS_FILE)
    return url, url[:at] + WEIGHTS_FILE + url[at + len(OPTIONS_FILE):]
  raise download.DownloadError(f"{url}: give the URL of an options.json, of a folder (ending in /) holding "
                               "options.json and weights.hdf5, or of an archive (.zip, .tar.gz, .tar.bz2)")


def _from_bucket(url: str, use: str) -> ResolvedModel:
  """A model folder in a bucket, read from its local copy (a training run there: its export only)."""
  if storage.isdir(storage.join(url, EXPORT_DIR)):
    return _run(url, fetch=True)
  try:
    local = storage.local(url)
  except FileNotFoundError as e:
    raise download.DownloadError(str(e)) from None
  return dataclasses.replace(resolve_model(local, use=use), path=url)


def _one_model_in(folder: str) -> None:
  """Refuses a TF-Hub module folder that also holds another model's files, naming both (which one is meant?)."""
  if any(os.path.exists(os.path.join(folder, name)) for name in (efml.ENCODER, efml.CONFIG)):
    other = "an ELMoForManyLangs model"
  elif glob.glob(os.path.join(glob.escape(folder), "*.hdf5")):
    other = "an options.json + weights.hdf5 pair"
  else:
    return
  raise download.DownloadError(f"{folder}: holds a TF-Hub module (variables/) and {other}; which one is meant "
                               "is ambiguous: give a folder that holds one model")


def _from_url(url: str) -> ResolvedModel:
  if urllib.parse.urlparse(url).scheme == "file" and os.path.isdir(download.cached_path(url)):
    # a file:// folder is that folder, whatever model it holds (TF-Hub, ELMoForManyLangs, a pair)
    return dataclasses.replace(resolve_model(download.cached_path(url)), path=url)
  options_url, weight_url = _url_pair(url)
  return ResolvedModel(download.cached_path(options_url, kind="options"),
                       download.cached_path(weight_url, kind="hdf5"), path=url)


def _from_archive(spec: str, use: str) -> ResolvedModel:
  """An archive, unpacked once into the cache (`archive.model_folder`), read as the local folder it holds."""
  folder = archive.model_folder(spec)
  models = sorted(entry.name + "/" for entry in os.scandir(folder) if entry.is_dir() and _holds_a_model(entry.path))
  if len(models) > 1:
    raise archive.ArchiveError(f"{spec}: holds {len(models)} model folders ({', '.join(models[:3])}); which one is "
                               f"meant is ambiguous: give one of them as the model, in {folder}")
  try:
    found = resolve_model(folder, use=use)
  except (download.DownloadError, SourceError) as e:
    raise archive.ArchiveError(f"{spec}: unpacked into {folder}, which holds no model it can read: "
                               f"{str(e).removeprefix(folder + ': ')}") from None
  return found if use == "init_from" else dataclasses.replace(found, path=spec)


def _holds_a_model(folder: str) -> bool:
  """A folder of any format `_local_folder` reads (options + weights: some .json and some .hdf5)."""
  if tfhub.is_module(folder) or efml.is_efml_dir(folder) or model_folder.is_folder(folder):
    return True
  return bool(glob.glob(os.path.join(glob.escape(folder), "*.json"))
              and glob.glob(os.path.join(glob.escape(folder), "*.hdf5")))


def _run(workdir: str, fetch: bool) -> ResolvedModel:
  """A training run's export/ pair and vocab.txt (`run_layout`); fetched: a bucket run's local copy, and
  the vocabulary only where there is one."""
  if fetch:
    workdir = storage.local(workdir, names=RUN_FILES)
  options_file, weight_file = (os.path.join(workdir, rel) for rel in export_files())
  export = os.path.join(workdir, EXPORT_DIR)
  efml_dir = export if efml.is_efml_dir(export) else None  # an EFML-style run exports an EFML folder
  if efml_dir is not None:
    options_file, weight_file = (os.path.join(export, n) for n in (efml.CONFIG, efml.ENCODER))
  vocab = os.path.join(workdir, VOCAB_FILE)
  if fetch and not os.path.exists(vocab):
    vocab = None
  if model_folder.is_folder(export):  # a run exporting safetensors (config.export_format)
    return ResolvedModel(vocab_file=vocab, workdir=workdir, path=workdir, folder_dir=export)
  return ResolvedModel(options_file, weight_file, vocab, workdir=workdir, path=workdir, efml_dir=efml_dir)


def _pair_in_folder(folder: str) -> tuple[str, str]:
  """(options, weights) of a local folder: a training run's export/, or `options.json` + `weights.hdf5`,
  else the one `*options*.json` and the one `*weights*.hdf5` (or only `*.hdf5`) there."""
  if os.path.isdir(os.path.join(folder, EXPORT_DIR)):
    folder = os.path.join(folder, EXPORT_DIR)
  found = []
  for patterns in ((OPTIONS_FILE, "*options*.json"), (WEIGHTS_FILE, "*weights*.hdf5", "*.hdf5")):
    for pattern in patterns:
      matches = sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))
      if len(matches) == 1:
        found.append(matches[0])
        break
    else:
      raise download.DownloadError(f"{folder}: expected one {patterns[-1]} there, found {len(matches)}")
  return found[0], found[1]


def _checkpoint_dir(path: str) -> tuple[str, int | None] | None:
  """(checkpoints dir, step or None=latest) if `path` is a workdir, its checkpoints/ or one step folder (in
  a bucket too: Orbax reads it there)."""
  if storage.isdir(storage.join(path, CHECKPOINTS)):
    return storage.join(path, CHECKPOINTS), None
  path = path.rstrip("/") if storage.is_remote(path) else os.path.normpath(path)
  name = path.rsplit("/", 1)[-1]
  if name.isdigit() and storage.isdir(storage.join(path, "state")):
    return path.rsplit("/", 1)[0], int(name)
  if any(n.isdigit() for n in storage.listdir(path)):
    return path, None
  return None


def _init_source(path: str) -> ResolvedModel:
  """`use="init_from"` past names and URLs: a local path made absolute; in a bucket, checkpoints stay there
  and ELMo files are read from their local copy."""
  if storage.is_remote(path):
    if not storage.exists(path):
      raise SourceError(f"{path}: no such object or folder in the bucket")
  else:
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
      raise SourceError(f"{path}: no such file or folder")
  found = _checkpoint_dir(path)
  if found is not None:
    return ResolvedModel(checkpoints=found, path=path)
  path = storage.local(path)
  return ResolvedModel(*_elmo_files(path), path=path)


def _elmo_files(path: str) -> tuple[str, str]:
  """(options.json, weights.hdf5) from an options.json, an hdf5 or a folder holding both."""
  if os.path.isfile(path) and not path.endswith((".hdf5", ".h5", ".json")):
    raise SourceError(f"{path} is {files.looks_like(path)}; expected {_INIT_FROM}")
  if (os.path.isdir(path) and not glob.glob(os.path.join(path, "*.hdf5"))
      and not os.path.exists(os.path.join(path, OPTIONS_FILE))):
    raise SourceError(f"{path} is a folder with no checkpoints, options.json or *.hdf5; expected {_INIT_FROM}")
  folder = path if os.path.isdir(path) else os.path.dirname(path)
  if path.endswith(".hdf5") or path.endswith(".h5"):
    options = os.path.join(folder, OPTIONS_FILE)
    candidates = sorted(glob.glob(os.path.join(folder, "*options*.json")))
    if not os.path.exists(options) and len(candidates) == 1:
      options = candidates[0]  # else options.json, which the load then says is missing
    return options, path
  options = path if path.endswith(".json") else os.path.join(folder, OPTIONS_FILE)
  weights = sorted(glob.glob(os.path.join(folder, "*.hdf5")))
  if len(weights) != 1:
    raise SourceError(f"{path}: expected one *.hdf5 beside {options}, found {len(weights)}; "
                      "point init_from at the hdf5 file itself")
  return options, weights[0]


def _vocab_beside(found: ResolvedModel) -> ResolvedModel:
  """`init_from`'s vocabulary: the vocab.txt beside the weights, if any (a run's export/ has one)."""
  if found.weight_file is None:
    return found
  vocab = os.path.join(os.path.dirname(found.weight_file), VOCAB_FILE)
  return dataclasses.replace(found, vocab_file=vocab if os.path.exists(vocab) else None)


def is_model_spec(text: str) -> bool:
  """True for what `resolve` takes beyond a plain file: a released name or a URL."""
  return text in MODELS or download.is_url(text)
