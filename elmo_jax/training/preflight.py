"""Checks a training run before anything is written: one line per mistake, nothing half-made.

The one validation phase of `train.py`, in two calls:
- `check(config, workdir)` before JAX starts: the workdir (a directory, writable, its name UTF-8, every name
  of the run layout in it of its kind), every config value with a range or a set of choices, the model
  options, the data (files that exist, are text and hold a sentence; prepared directories that verify),
  `init_from` (its weight file's datasets too), and a saved `vocab.txt` against this run's vocabulary
  settings;
- `check_run(config, workdir, n_devices, n_processes)` once JAX knows the devices: the batch splits over
  them (`config.global_batch_size`), and a checkpoint in the workdir can be resumed by this config (the same
  test the restore applies).
Only then does the trainer lock the workdir and write `config.json`, `vocab.txt` or `prepared/`.
"""
from __future__ import annotations

import difflib
import gzip
import json
import os
import sys

import ml_collections

from elmo_jax.data import manifest
from elmo_jax.data import prepare_inputs
from elmo_jax.data.sources import LIST_HINT, expand_paths, split_paths
from elmo_jax.formats import options as options_lib
from elmo_jax.runtime import files
from elmo_jax.runtime import log
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import RUN_FOLDERS, TOP_FILES, TOP_FOLDERS, VOCAB_FILE
from elmo_jax.sources.resolve import folder_files
from elmo_jax.training import checkpoint
from elmo_jax.training import derived
from elmo_jax.training import init_from
from elmo_jax.training import input as input_lib
from elmo_jax.training import profile
from elmo_jax.training import resume
from elmo_jax.training.config import BatchSizeError, base_config, global_batch_size, with_global_batch
from elmo_jax.training.workdir import Workdir

_BLOCK = 1 << 20

# Numeric keys: (integers only?, lower bound, bound included?). The loop divides by, counts to or sleeps on
# them; a clip of 0 or an accumulator <= 0 zeroes (or blows up) every update without an error.
_NUMBERS = {**{k: (True, 1, True) for k in (
               "unroll_steps", "num_train_steps", "log_every_steps", "eval_every_steps",
               "checkpoint_every_steps", "keep_checkpoints", "stop_check_every_steps", "scan_unroll",
               "data.vocab_min_count", "data.max_token_chars")},
            **{k: (True, 0, True) for k in ("prefetch_batches", "n_negative_samples", "warmup_steps",
                                             "freeze_bilm_steps", "eval_max_batches", "batch_size",
                                             "per_device_batch_size")},
            "seed": (True, None, True),
            **{k: (False, 0, False) for k in ("learning_rate", "grad_clip", "adagrad_initial_accumulator",
                                              "checkpoint_timeout_s")},
            **{k: (False, 0, True) for k in ("weight_decay", "dropout", "data.auto_prepare_max_mb")}}
_CHOICES = {"optimizer": ("adagrad", "adam", "adamw"), "dtype": ("float32", "bfloat16"),
            "data.shard": ("sentences", "rows")}


class PreflightError(ValueError):
  """A config or workdir that cannot start a run; the message is one line naming the key or file."""


def check(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Raises PreflightError for anything that would fail later (or leave a workdir a rerun trusts)."""
  _check_utf8_name("--workdir", workdir)
  try:
    storage.check_output(workdir, "--workdir", directory=True)
  except files.UnsafeOutputError as e:
    raise PreflightError(str(e)) from None
  run = Workdir(workdir)
  run.pull()  # a bucket workdir: its files (not the checkpoints) into the local copy that is checked here
  _check_run_entries(run)
  check_values(config)
  if config.profile_steps and config.profile_dir:  # the default, WORKDIR/profile, is checked with the workdir
    try:
      storage.check_output(config.profile_dir, "config.profile_dir", directory=True)
    except files.UnsafeOutputError as e:
      raise PreflightError(str(e)) from None
    _check_profile_dir(config.profile_dir, workdir)
  data = config.data
  if data.prepared_dir:
    check_prepared_dir("config.data.prepared_dir", data.prepared_dir, config)
    if data.prepared_eval_dir:
      check_prepared_dir("config.data.prepared_eval_dir", data.prepared_eval_dir, config)
  elif data.prepared_eval_dir:
    raise PreflightError("config.data.prepared_eval_dir is set without config.data.prepared_dir: a prepared eval "
                         "split goes with a prepared train split (or give the text as config.data.eval_files)")
  elif not data.tfds_name:
    if not data.train_files:
      raise PreflightError("config.data.train_files is empty and config.data.tfds_name is not set: "
                           "no training data")
    check_text_files("config.data.train_files", data.train_files)
    if data.eval_files:
      check_text_files("config.data.eval_files", data.eval_files)
  if data.vocab_file:
    check_vocab(data.vocab_file, "config.data.vocab_file")
  _check_sources_kept(config, workdir)  # first: a source the run would write over is the first thing to say
  if config.init_from:
    _check_init_from(config)
  _check_saved_vocab(run)


def _check_sources_kept(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Nothing the run reads is where it writes (`run_layout`'s names in the workdir): every file of its
  `init_from` source (an EFML folder as --workdir would get the run's config.json), its lexicon folder, its
  text and vocabulary. One line, before anything is written (`storage.check_output`'s `owns`)."""
  data = config.data
  sources = []
  for key in ("train_files", "eval_files"):
    try:
      sources += expand_paths(split_paths(data[key])) if data[key] and not data.tfds_name else []
    except (FileNotFoundError, ValueError):
      pass  # check_text_files named it
  lexicon = data.get("lexicon", "")
  listed = lexicon and lexicon != "build" and os.path.isdir(lexicon)  # "build": made from the text
  sources += [data.vocab_file, *(folder_files(lexicon) if listed else ())]
  try:
    sources += init_from.source_files(config.init_from) if config.init_from else []
    storage.check_output(workdir, "--workdir", directory=True, inputs=sources, owns=TOP_FILES + TOP_FOLDERS)
  except (files.UnsafeOutputError, init_from.InitFromError) as e:
    raise PreflightError(str(e)) from None


def _check_utf8_name(what: str, path: str) -> None:
  """A path whose name holds bytes that are not UTF-8 (os.fsdecode's surrogates) cannot be written into
  config.json, TensorBoard's hparams, a checkpoint or a bucket URL: refused in one line before anything is
  made."""
  try:
    os.fspath(path).encode("utf-8")
  except UnicodeEncodeError:
    shown = os.fsencode(path).decode("utf-8", "backslashreplace")
    raise PreflightError(f"{what}={shown}: the name holds bytes that are not UTF-8; rename it (or give "
                         "another path)") from None


def _check_run_entries(run: Workdir) -> None:
  """Every name the run layout owns (`run_layout.TOP_FILES`, `TOP_FOLDERS`) is absent or of its kind, in the
  workdir (a bucket's objects too) and its local copy: a folder named train.lock or metrics.jsonl, a file
  named checkpoints, would otherwise fail after config.json, vocab.txt and prepared/ were written."""
  wanted = {**{name: "file" for name in TOP_FILES}, **{name: "folder" for name in TOP_FOLDERS}}
  for where in dict.fromkeys((run.local, run.path)):  # one folder when local
    for name, kinds in storage.top_level_kinds(where).items():
      other = kinds - {wanted.get(name)} if name in wanted else set()
      if other:
        raise PreflightError(f"{storage.join(where, name)} is a {' and a '.join(sorted(other))}, where a run keeps "
                             f"its {name} {wanted[name]}; move it away, or use another --workdir")


def check_values(config: ml_collections.ConfigDict) -> None:
  """Ranges, choices and the model options (`config.options` as an options.json)."""
  flat = resume.flatten(config.to_dict())
  _check_known_keys(flat)
  for key, value in flat.items():  # file names above all: config.json, TensorBoard and checkpoints hold them
    if isinstance(value, str):
      _check_utf8_name(f"config.{key}", value)
  for key, (integer, low, inclusive) in _NUMBERS.items():
    if key in flat:
      _check_number(key, flat[key], integer, low, inclusive)
  if not flat["dropout"] < 1:
    raise PreflightError(f"config.dropout={flat['dropout']}: must be in [0, 1)")
  for key, choices in _CHOICES.items():
    if key in flat and flat[key] not in choices:
      raise PreflightError(f"config.{key}={flat[key]!r}: must be one of {', '.join(map(repr, choices))}")
  _check_batch_and_profile(flat)
  size = flat.get("data.vocab_max_size")
  if size is not None:
    _check_number("data.vocab_max_size", size, True, None, True)
  if size is not None and size < 4:
    raise PreflightError(f"config.data.vocab_max_size={size}: must hold <S>, </S>, <UNK> and a word (>= 4)")
  try:
    options_lib.validate(config.options.to_dict(), "config.options")
  except options_lib.OptionsError as e:
    raise PreflightError(str(e)) from None


def _check_batch_and_profile(flat: dict) -> None:
  """Exactly one of batch_size / per_device_batch_size (their split over the devices: `check_run`), and
  profile_steps naming steps of this run."""
  try:
    global_batch_size(flat.get("batch_size", 0), flat.get("per_device_batch_size", 0), 1)
    steps = profile.parse_steps(flat.get("profile_steps", ""))
  except (BatchSizeError, profile.ProfileStepsError) as e:
    raise PreflightError(str(e)) from None
  if steps is not None and steps[0] > flat["num_train_steps"]:
    raise PreflightError(f"config.profile_steps={flat['profile_steps']!r} starts after the last step "
                         f"(config.num_train_steps={flat['num_train_steps']})")
  for key, kind in (("profile_dir", str), ("profile_all_processes", bool)):
    if key in flat and not isinstance(flat[key], kind):
      raise PreflightError(f"config.{key}={flat[key]!r}: must be a {kind.__name__}, not {type(flat[key]).__name__}")


def _check_known_keys(flat: dict) -> None:
  """A key the trainer has no setting for is a typo in a config file (`c.learning_rat = 0.5`): refused, or the
  run would silently train with the default. (`--config.x` overrides are checked when parsed.)"""
  known = [k for k in resume.flatten(base_config().to_dict()) if not k.startswith("options.")]
  for key in flat:
    if not key.startswith("options.") and key not in known:
      close = difflib.get_close_matches(key, known, n=1)
      raise PreflightError(f"config.{key} is not a setting of the trainer (a typo in the config file?)"
                           + (f"; did you mean config.{close[0]}?" if close else ""))


def _check_number(key: str, value, integer: bool, low, inclusive: bool) -> None:
  kind = "an integer" if integer else "a number"
  if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
    raise PreflightError(f"config.{key}={value!r}: must be {kind}, not {type(value).__name__}")
  if low is not None and (value < low if inclusive else value <= low):
    what = ("nothing would be trained" if key == "num_train_steps"
            else f"must be {'>=' if inclusive else '>'} {low}")
    raise PreflightError(f"config.{key}={value}: {what}")


def check_run(config: ml_collections.ConfigDict, workdir: str, n_devices: int, n_processes: int) -> None:
  """The batch splits over the devices, and the workdir's checkpoint (if any) is one this run resumes."""
  try:
    config = with_global_batch(config, n_devices)  # what the run records and a resume compares
  except BatchSizeError as e:
    raise PreflightError(str(e)) from None
  run = Workdir(workdir)
  found = checkpoint.newest_meta(run.checkpoints)
  if found is None:
    return
  step, meta = found
  vocab = _vocab_sha256(config, run.local)
  options = options_lib.validate(config.options.to_dict(), "config.options")
  try:
    resume.check_compatible(meta, config, options, vocab or meta.get("vocab_sha256"), n_processes,
                            f"{workdir} (checkpoint step {step})")
  except checkpoint.IncompatibleCheckpointError as e:
    raise PreflightError(str(e)) from None
  changed = _changed_train_file(meta.get("train_source"), config)
  if changed:
    raise PreflightError(f"config.data.train_files: {changed} (checkpoint step {step} in {workdir}): its data "
                         "position and vocabulary belong to the old text; restore the file, or use another "
                         "--workdir")


def _changed_train_file(saved, config: ml_collections.ConfigDict) -> str:
  """'F changed since (...)' for a training file edited since the checkpoint; "" if none. Sizes, and the
  content (sha256) where the checkpoint recorded it, not mtimes: a file copied or touched unchanged still
  resumes; a same-size edit (a word's case, a typo fixed in place) does not."""
  if not isinstance(saved, dict) or saved.get("kind") != "text":
    return ""  # TFDS, a prepared corpus, or a checkpoint written before this record
  try:
    now = input_lib.train_source(config.data) or {}
  except (ValueError, OSError):
    return ""  # the files are checked (one line) before this
  before = {f.get("path"): f for f in saved.get("files", []) if isinstance(f, dict)}
  for f in now.get("files", []):
    then = before.get(f["path"])
    if then is None:
      continue
    if then.get("size") != f["size"]:
      return f"{f['path']} changed since ({then.get('size'):,} bytes then, {f['size']:,} now)"
    for kind in ("sha256", "crc32c"):  # a local file's, a bucket object's
      if then.get(kind) and f.get(kind) and then[kind] != f[kind]:
        return (f"{f['path']} changed since (the same {f['size']:,} bytes, other content: {kind} "
                f"{str(then[kind])[:12]} then, {f[kind][:12]} now)")
  return ""


def _check_profile_dir(profile_dir: str, workdir: str) -> None:
  """A trace inside this run's own `checkpoints/` or `export/` would be deleted when the run replaces them (at
  its next save): refused before anything is written, on a fresh run too (`check_output` knows other runs)."""
  def resolved(path: str) -> str:
    return path.rstrip("/") if storage.is_remote(path) else os.path.realpath(path)
  target = resolved(profile_dir)
  for folder in RUN_FOLDERS:
    own = resolved(storage.join(workdir, folder))
    if target == own or target.startswith(own + ("/" if storage.is_remote(own) else os.sep)):
      raise PreflightError(f"config.profile_dir={profile_dir} is inside this run's {folder}/ folder, which the run "
                           "replaces whole (the trace would be deleted): give another folder (default: "
                           "WORKDIR/profile)")


def check_text_files(key: str, value: str) -> list[str]:
  """Every comma-separated path/glob of `value` (`sources.split_paths`) names text files holding at least one
  non-blank line."""
  try:
    paths = expand_paths(split_paths(value))
  except (FileNotFoundError, ValueError) as e:
    raise PreflightError(f"{key}: {e} ({LIST_HINT})") from None
  for path in paths:
    if files.is_stream(path):
      raise PreflightError(f"{key}: {path} is a pipe or FIFO, which can be read once; training reads its text "
                           "more than once (its sha256 for the resume check, then the text): write it to a file "
                           "first, or prepare it (elmo-jax prepare)")
    problem = files.text_problem(path)
    if problem:
      raise PreflightError(f"{key}: {path} {problem}")
    if _blank(path):
      raise PreflightError(f"{key}: {path} is empty (no non-blank line)")
  return paths


def check_prepared_dir(key: str, path: str, config: ml_collections.ConfigDict | None = None) -> None:
  """`path` is a prepared corpus (`elmo-jax prepare`) whose files match its manifest (sizes
  always, sha256 unless an earlier start verified these very files: `manifest.open_verified`), made for this
  model's char ids; tokenizer and vocabulary settings of the config that do not apply to it are named."""
  try:
    settings = manifest.open_verified(path)["settings"]
  except manifest.NotPreparedError:
    raise PreflightError(f"{key}={path} is not a prepared corpus (no manifest.json); make one with "
                         "`elmo-jax prepare`") from None
  except manifest.PrepareError as e:
    raise PreflightError(f"{key}: {e}") from None
  if config is None:
    return
  width = config.options.char_cnn.max_characters_per_token
  if settings["max_characters_per_token"] != width:
    raise PreflightError(f"{key}={path} holds char ids of {settings['max_characters_per_token']} characters per "
                         f"token, config.options.char_cnn.max_characters_per_token is {width}; prepare it again")
  if key != "config.data.prepared_dir":
    return  # an eval split is read with the train split's vocabulary: its own settings do not matter
  data = config.data
  vocab = settings["vocab"]
  made = {"pretokenized": settings["tokenizer"]["pretokenized"], "max_token_chars": settings["max_token_chars"]}
  if "max_size" in vocab:
    made.update(vocab_max_size=vocab["max_size"], vocab_min_count=vocab["min_count"])
  differ = [f"{k}={v!r} (config.data.{k}={data.get(k)!r})" for k, v in made.items() if data.get(k) != v]
  if differ:
    log.info(f"note: {path} was prepared with {', '.join(differ)}; the prepared corpus's settings apply",
             stream=sys.stderr)


def _blank(path: str) -> bool:
  """True when the file holds only whitespace (read until its first other byte: a long blank file too)."""
  if os.path.getsize(path) == 0:
    return True
  try:
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
      for block in iter(lambda: f.read(_BLOCK), b""):
        if block.strip():
          return False
  except (OSError, EOFError) as e:
    raise PreflightError(f"{path}: cannot read ({e})") from None
  return True


def _check_saved_vocab(run: Workdir) -> None:
  """The vocab.txt a checkpoint was trained with must load (without a checkpoint it is built again)."""
  saved = derived.kept(run.local, VOCAB_FILE, run.checkpoints)
  if saved:
    check_vocab(saved, "the workdir's vocabulary (resume)")


def check_vocab(path: str, what: str):
  """The vocabulary loads (`prepare_inputs.check_vocab_file`: text, specials present, counts matching);
  returns it. `what` names it in the message."""
  try:
    return prepare_inputs.check_vocab_file(path, f"{what}: {path}")
  except prepare_inputs.PrepareError as e:
    raise PreflightError(str(e)) from None


def _check_init_from(config: ml_collections.ConfigDict) -> None:
  """The run to start from exists and has this config's model shape (released names: when loaded)."""
  try:
    init_from.check(config.init_from, options_lib.validate(config.options.to_dict(), "config.options"))
  except init_from.InitFromError as e:
    raise PreflightError(str(e)) from None


def _vocab_sha256(config: ml_collections.ConfigDict, workdir: str) -> str | None:
  """The sha256 of the vocabulary this run will use, where it is known before building one."""
  for path in (os.path.join(workdir, VOCAB_FILE), config.data.vocab_file):
    if path and os.path.exists(path):
      return check_vocab(path, "the run's vocabulary").sha256()
  return None
