"""Resuming a workdir: refuse another configuration, and rewind metrics.jsonl to the restored step."""
from __future__ import annotations

import json
import os
from typing import Any

import ml_collections
from flax import traverse_util

from elmo_jax.runtime import files
from elmo_jax.training.checkpoint import IncompatibleCheckpointError
from elmo_jax.runtime.run_layout import METRICS_FILE

# Config keys that change the shape of the saved state or the meaning of the saved data position.
# The training data's identity too: a data position means nothing in another corpus. `batch_size` is the
# global batch of a config resolved by `config.with_global_batch` (so a per-device batch on other devices
# is refused, and the same rows asked for either way resume).
_SHAPE_KEYS = ("batch_size", "unroll_steps", "optimizer", "data.vocab_file", "data.vocab_max_size",
               "data.vocab_min_count", "data.pretokenized", "data.shard", "freeze_bilm_steps",
               "data.train_files", "data.tfds_name", "data.tfds_train_split", "data.prepared_dir")


def flatten(tree: dict[str, Any]) -> dict[str, Any]:
  """{"a.b": leaf} of a nested dict; array leaves as lists (JSON-comparable). Empty dicts drop out."""
  return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in traverse_util.flatten_dict(tree, sep=".").items()}


def normalise(value: Any) -> Any:
  return json.loads(json.dumps(value))  # tuples -> lists, so a config and its JSON compare equal


def options_difference(saved: dict[str, Any], wanted: dict[str, Any]) -> str | None:
  """'lstm.dim is 32 there, 64 here' for the first differing model option; None if they agree."""
  a, b = flatten(normalise(saved)), flatten(normalise(wanted))
  for key in sorted(set(a) | set(b)):
    if key == "char_cnn.n_characters":  # 261 vs 262 is the same table (validate() normalises to 262)
      continue
    if a.get(key) != b.get(key):
      return f"{key} is {a.get(key, '<unset>')!r} there, {b.get(key, '<unset>')!r} here"
  return None


def check_compatible(meta: dict[str, Any], config: ml_collections.ConfigDict, options: dict[str, Any],
                     vocab_sha256: str, n_processes: int, where: str) -> None:
  """Raises IncompatibleCheckpointError (one line naming what differs) unless `meta` can resume `config`."""
  saved = meta.get("config", {})
  diff = options_difference(saved.get("options", {}), options)
  if diff is not None:
    raise IncompatibleCheckpointError(f"{where}: model shape differs from the checkpoint: options.{diff}; "
                                      "use another --workdir (or --config.init_from) to train this model")
  flat_saved, flat_now = flatten(normalise(saved)), flatten(normalise(config.to_dict()))
  for key in _SHAPE_KEYS:
    if key in flat_saved and flat_saved.get(key) != flat_now.get(key):
      per_device = flat_now.get("per_device_batch_size") if key == "batch_size" else 0
      how = (f" ({per_device} per device x {flat_now[key] // per_device} devices: config.per_device_batch_size)"
             if per_device else "")
      raise IncompatibleCheckpointError(
          f"{where}: config.{key} is {flat_now.get(key)!r}{how} but the checkpoint was trained with "
          f"{flat_saved.get(key)!r}; set it back or use another --workdir")
  if meta.get("vocab_sha256") != vocab_sha256:
    raise IncompatibleCheckpointError(
        f"{where}: the checkpoint was trained with another vocabulary than this run's (vocab sha256 "
        f"{str(meta.get('vocab_sha256'))[:12]} there, {vocab_sha256[:12]} here); use another --workdir")
  saved_procs = len(meta.get("data", [])) if isinstance(meta.get("data"), list) else 1
  if saved_procs != n_processes:
    raise IncompatibleCheckpointError(
        f"{where}: the checkpoint was written by {saved_procs} process(es), this run has {n_processes}; "
        "resume with the same number of processes")


def rewind_metrics(workdir: str, step: int) -> int:
  """Drops metrics.jsonl records with step > `step` (written after the checkpoint we resume from).

  So a resumed run's file equals an uninterrupted run's, except timing fields: the records between the
  restored checkpoint and the crash are written again by the resumed run. The file is replaced atomically;
  a torn last line (killed mid-write) is dropped too. Returns how many records were dropped.
  (TensorBoard event files cannot be rewound; TensorBoard shows the newest value of a repeated step.)
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return 0
  kept, dropped = [], 0
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        dropped += 1
        continue
      if int(record.get("step", 0)) <= step:
        kept.append(line if line.endswith("\n") else line + "\n")
      else:
        dropped += 1
  if dropped:
    files.write_text(path, "".join(kept))
  return dropped
