"""What a preparation depends on (`settings_of`: its input, tokenizer, vocabulary), recorded in its manifest, and
how two such settings differ (`settings_difference`: why a rerun cannot resume, in one line)."""
from __future__ import annotations

import json
import os
import time
from typing import Any

from elmo_jax.data.manifest import FORMAT_VERSION
from elmo_jax.runtime import files


def describe_source(spec: Any) -> str:
  """The input in a few words: its first files, or the TFDS dataset and split."""
  try:
    if spec["kind"] == "tfds":
      return f"tfds {spec['name']}/{spec['split']}"
    return ", ".join(f["path"] for f in spec["files"][:3]) + (" ..." if len(spec["files"]) > 3 else "")
  except (KeyError, TypeError):  # a damaged settings.json
    return json.dumps(spec)[:80]


def _when(mtime_ns: Any) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns / 1e9)) if isinstance(mtime_ns, int) else "?"


def _source_difference(saved: Any, wanted: Any) -> str:
  """'source is A there, B here' / 'source file F changed (...)': how two inputs differ; "" if they agree."""
  if saved == wanted:
    return ""
  if not (isinstance(saved, dict) and isinstance(wanted, dict)) or saved.get("kind") != wanted.get("kind"):
    return f"source is {describe_source(saved)} there, {describe_source(wanted)} here"
  if saved["kind"] == "tfds":
    return files.first_difference(saved, wanted, "source.")
  saved_files = saved.get("files") or []
  wanted_files = wanted.get("files") or []
  if [f.get("path") for f in saved_files] != [f.get("path") for f in wanted_files]:
    return f"source is {describe_source(saved)} there, {describe_source(wanted)} here"
  for was, now in zip(saved_files, wanted_files):
    if was != now:
      return (f"source file {now['path']} changed since: {was.get('size')} bytes modified "
              f"{_when(was.get('mtime_ns'))} there, {now['size']} bytes modified {_when(now['mtime_ns'])} here")
  return files.first_difference(saved, wanted, "source.")


def settings_difference(saved: dict[str, Any], wanted: dict[str, Any]) -> str:
  """The first difference of two `settings_of` dicts, the corpus (`source`) before any setting; "" if none."""
  if not isinstance(saved, dict):
    return f"settings are {json.dumps(saved)[:80]} there"
  found = _source_difference(saved.get("source"), wanted.get("source"))
  if found:
    return found
  return files.first_difference({k: v for k, v in saved.items() if k != "source"},
                                {k: v for k, v in wanted.items() if k != "source"})


def settings_of(spec, pretokenized: bool, lang: str, max_token_chars: int, max_characters_per_token: int,
                vocab_max_size: int | None, vocab_min_count: int, vocab_file: str):
  """Everything the output depends on (not the worker count or chunk size: they never change a byte)."""
  vocab = ({"file": os.path.abspath(vocab_file), "sha256": files.sha256_file(vocab_file)} if vocab_file
           else {"max_size": vocab_max_size, "min_count": vocab_min_count})
  return {"format_version": FORMAT_VERSION, "source": spec,
          "tokenizer": {"pretokenized": bool(pretokenized), "lang": lang},
          "max_token_chars": max_token_chars, "max_characters_per_token": max_characters_per_token,
          "vocab": vocab}
