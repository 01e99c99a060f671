"""A prepared corpus directory's manifest (the settings it was made with, how two differ) and the one verified
opener every reader goes through.

`open_verified(D)` (used by `PreparedCorpus`, the trainer's preflight, `evaluate.py --text_file=D` and
`prepare`'s own rerun): `manifest.json` must be a manifest of this format, every file it lists must have its
recorded size (always checked), and its sha256 must equal the manifest's. A file's hash is remembered in
`$ELMO_JAX_CACHE/prepared-verified/` with its size, mtime and ctime, so an unchanged directory is hashed once,
not at every start; the directory itself is never written to when opened (it may be read-only).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable

from elmo_jax import files
from elmo_jax import log
from elmo_jax.progress import progress

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARTIAL = ".partial"
OUTPUT_FILES = ("tokens.npy", "offsets.npy", "types.txt", "type_counts.npy", "type_chars.npy", "vocab.txt",
                "vocab_counts.tsv")


class PrepareError(ValueError):
  """A user's mistake (bad input, a directory holding another corpus); the message is one line."""


class PreparedCorpusError(PrepareError, OSError):
  """A prepared directory that cannot be read as one: a damaged manifest, or a file missing, of another size,
  or of another sha256 than its manifest records. One line naming the file. Also an OSError, so a command
  that reports unreadable files in one line reports this too."""


class NotPreparedError(PreparedCorpusError, FileNotFoundError):
  """A directory without manifest.json: not prepared, or its preparation did not finish."""


AGAIN = "prepare it again into a new directory"
VERIFY_CACHE = "prepared-verified"  # under $ELMO_JAX_CACHE: the files' last successful sha256 checks


# --- settings: what a preparation depends on, and how two of them differ ---------------------------------
def _describe_spec(spec: dict[str, Any]) -> str:
  if spec["kind"] == "tfds":
    return f"tfds {spec['name']}/{spec['split']}"
  return ", ".join(f["path"] for f in spec["files"][:3]) + (" ..." if len(spec["files"]) > 3 else "")


def describe_source(spec: Any) -> str:
  """The input in a few words: its first files, or the TFDS dataset and split."""
  try:
    return _describe_spec(spec)
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
  a, b = saved.get("files") or [], wanted.get("files") or []
  if [f.get("path") for f in a] != [f.get("path") for f in b]:
    return f"source is {describe_source(saved)} there, {describe_source(wanted)} here"
  for x, y in zip(a, b):
    if x != y:
      return (f"source file {y['path']} changed since: {x.get('size')} bytes modified {_when(x.get('mtime_ns'))} "
              f"there, {y['size']} bytes modified {_when(y['mtime_ns'])} here")
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


# --- reading a prepared directory: one verified opener ------------------------------------------------
def _damaged(path: str, what: str) -> PreparedCorpusError:
  return PreparedCorpusError(f"{path} {what}; {AGAIN}")


def _check_manifest(path: str, manifest: Any) -> dict[str, Any]:
  """`manifest` if it is a manifest of this format, else PreparedCorpusError saying what is wrong."""
  if not isinstance(manifest, dict):
    raise _damaged(path, f"is not a prepared corpus's manifest (a JSON {type(manifest).__name__}, not an object)")
  for key in ("settings", "counts", "sha256"):
    if not isinstance(manifest.get(key), dict):
      raise _damaged(path, f"is not a prepared corpus's manifest (no {key!r} object)")
  settings, counts, digests = manifest["settings"], manifest["counts"], manifest["sha256"]
  if settings.get("format_version") != FORMAT_VERSION:
    raise _damaged(path, f"is of format_version {json.dumps(settings.get('format_version'))[:40]}; this version "
                         f"reads {FORMAT_VERSION}")
  if not (isinstance(settings.get("tokenizer"), dict) and isinstance(settings.get("max_token_chars"), int)
          and isinstance(settings.get("max_characters_per_token"), int)):
    raise _damaged(path, "lacks the tokenizer settings")
  for key in ("n_sentences", "n_tokens", "n_types"):
    if not isinstance(counts.get(key), int) or isinstance(counts[key], bool) or counts[key] < 0:
      raise _damaged(path, f"has counts.{key} = {json.dumps(counts.get(key))[:40]}, not a count")
  for name in OUTPUT_FILES:
    if name not in digests:
      raise _damaged(path, f"lists no sha256 of {name}")
  sizes = manifest.get("sizes", {})  # absent in manifests written before sizes were recorded
  for name, digest in digests.items():
    if os.path.basename(name) != name or name in ("", ".", "..") or not (
        isinstance(digest, str) and len(digest) == 64):
      raise _damaged(path, f"has sha256[{json.dumps(name)[:60]}] = {json.dumps(digest)[:70]}, not a file's sha256")
    if not isinstance(sizes, dict) or not isinstance(sizes.get(name, 0), int):
      raise _damaged(path, f"has no byte count of {name} in 'sizes'")
  return manifest


def read_manifest(directory: str) -> dict[str, Any] | None:
  """The manifest of a prepared `directory`, None without manifest.json. Raises PreparedCorpusError for a
  manifest that cannot be read, is not JSON, or is not of this format (one line naming it)."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.exists(path):
    return None
  try:
    with open(path, "rb") as f:
      manifest = json.loads(f.read().decode("utf-8"))
  except UnicodeDecodeError:
    raise _damaged(path, "is not UTF-8 text (binary data), not a manifest") from None
  except json.JSONDecodeError as e:
    raise _damaged(path, f"is not valid JSON ({e.msg}: line {e.lineno} column {e.colno})") from None
  except OSError as e:
    raise PreparedCorpusError(f"{path} cannot be read ({e.strerror or e})") from None
  return _check_manifest(path, manifest)


def _verify_cache_path(real: str) -> str:
  from elmo_jax.download import cache_dir  # pylint: disable=g-import-not-at-top
  return os.path.join(cache_dir(), VERIFY_CACHE, hashlib.sha256(real.encode()).hexdigest()[:16] + ".json")


def _file_key(st: os.stat_result) -> dict[str, int]:
  """What the cache trusts: a file whose size, mtime and ctime are unchanged has unchanged bytes. ctime (the
  inode change time) moves on every write and cannot be set back, not even by os.utime."""
  return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _load_verified(cache_path: str, real: str) -> dict[str, Any]:
  try:
    with open(cache_path, encoding="utf-8") as f:
      cached = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(cached, dict) or cached.get("directory") != real or not isinstance(cached.get("files"), dict):
    return {}
  return dict(cached["files"])


def _save_verified(cache_path: str, real: str, entries: dict[str, Any], log_line) -> None:
  try:
    files.write_json(cache_path, {"directory": real, "files": entries})
  except OSError as e:  # an unwritable cache costs a re-hash next time, nothing else
    log_line(f"cannot record the verification of {real} in {cache_path} ({e.strerror or e}): it is hashed again "
             "at the next start")


def _remember_verified(directory: str, entries: dict[str, Any], log_line) -> None:
  real = os.path.realpath(directory)
  path = _verify_cache_path(real)
  _save_verified(path, real, {**_load_verified(path, real), **entries}, log_line)


def write_manifest(out: str, fields: dict[str, Any], log_line: Callable[[str], None] = log.info) -> dict[str, Any]:
  """Writes `out/manifest.json` (the last file of a preparation): `fields` plus the size and sha256 of every
  output file; the hashes just taken count as the first verification, so the first reader does not hash the
  files again. Returns the manifest."""
  before = {name: os.stat(os.path.join(out, name)) for name in OUTPUT_FILES}
  digests = {name: files.sha256_file(os.path.join(out, name)) for name in OUTPUT_FILES}
  manifest = {**fields, "sizes": {name: before[name].st_size for name in OUTPUT_FILES}, "sha256": digests}
  files.write_json(os.path.join(out, MANIFEST), manifest)
  _remember_verified(out, {name: {**_file_key(before[name]), "sha256": digests[name]} for name in OUTPUT_FILES
                           if _file_key(os.stat(os.path.join(out, name))) == _file_key(before[name])}, log_line)
  return manifest


def _human(n: int) -> str:
  for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} bytes"


def _hash(path: str, bar) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
      bar.update(len(block))
  return digest.hexdigest()


def verify_files(directory: str, manifest: dict[str, Any], *, checksums: bool = True, use_cache: bool = True,
                 log_line: Callable[[str], None] = log.info) -> None:
  """Checks every file `manifest` lists: present, a regular file, of the recorded size and (`checksums`) of
  the recorded sha256. Hashes only the files the cache does not vouch for (`_file_key`), and records the
  ones that pass. Never writes into `directory`. Raises PreparedCorpusError naming the first bad file."""
  digests, sizes = manifest["sha256"], manifest.get("sizes", {})
  stats = {}
  for name in digests:
    path = os.path.join(directory, name)
    try:
      st = os.stat(path)
    except FileNotFoundError:
      raise PreparedCorpusError(f"{path} is missing (listed in {MANIFEST}); {AGAIN}") from None
    except OSError as e:
      raise PreparedCorpusError(f"{path} cannot be read ({e.strerror or e})") from None
    if not os.path.isfile(path):
      raise _damaged(path, "is not a regular file")
    if name in sizes and st.st_size != sizes[name]:
      raise PreparedCorpusError(f"{path} is {st.st_size:,} bytes, {MANIFEST} records {sizes[name]:,} (truncated or "
                                f"changed after preparing); {AGAIN}")
    stats[name] = st
  if not checksums:
    return
  real = os.path.realpath(directory)
  cache_path = _verify_cache_path(real)
  cached = _load_verified(cache_path, real) if use_cache else {}
  todo = [n for n in stats if cached.get(n) != {**_file_key(stats[n]), "sha256": digests[n]}]
  if not todo:
    return
  total = sum(stats[n].st_size for n in todo)
  started = time.time()
  bar = progress(desc=f"verifying {os.path.basename(real)}", total=total, unit="B", disable=total < 64 << 20)
  try:
    for name in todo:
      path = os.path.join(directory, name)
      cached.pop(name, None)
      try:
        digest = _hash(path, bar)
        after = os.stat(path)
      except OSError as e:
        raise PreparedCorpusError(f"{path} cannot be read ({e.strerror or e})") from None
      if digest != digests[name]:
        raise PreparedCorpusError(f"{path} fails its sha256 checksum (it differs from {MANIFEST}'s: the file changed "
                                  f"after preparing); {AGAIN}")
      if _file_key(after) == _file_key(stats[name]):  # not being written while it was read
        cached[name] = {**_file_key(after), "sha256": digest}
  finally:
    bar.close()
    if use_cache:
      _save_verified(cache_path, real, cached, log_line)
  log_line(f"verified {directory}: sha256 of {len(todo)} of {len(stats)} files, {_human(total)}, in "
           f"{time.time() - started:.1f}s" + (f" (not hashed again while their size, mtime and ctime stay as "
                                               f"recorded in {cache_path})" if use_cache else ""))


def open_verified(directory: str, *, checksums: bool = True, use_cache: bool = True,
                  log_line: Callable[[str], None] = log.info) -> dict[str, Any]:
  """The manifest of the finished prepared `directory`, after checking it and every file it lists: the one
  way into a prepared directory (`PreparedCorpus`, the trainer, evaluation, `prepare`'s rerun).

  Checks, always: manifest.json is a JSON object of this format (`FORMAT_VERSION`), every listed file exists
  with its recorded size. With `checksums`, also every file's sha256. A file's successful check is remembered
  in `$ELMO_JAX_CACHE/prepared-verified/<sha256(realpath)[:16]>.json` (written atomically; the directory
  itself is never written, it may be read-only) with its size, mtime and ctime: while all three are
  unchanged the file is trusted without hashing, so a 4 GB corpus is hashed once, not at every start. Any
  write changes the ctime (os.utime restoring the mtime does too), so an edit is found; a change of the
  bytes that touches neither (bit rot on the disk) is not: `verify(directory)` hashes everything.
  `use_cache=False` neither reads nor writes the cache.

  Raises:
    NotPreparedError (a FileNotFoundError): no manifest.json (not prepared, or unfinished).
    PreparedCorpusError (an OSError): a damaged manifest, or a file missing, of another size or sha256;
      one line naming the file.
  """
  directory = os.path.abspath(directory)
  if not os.path.isdir(directory):
    raise NotPreparedError(f"{directory}: no such directory, not a prepared corpus (run "
                           "`python -m elmo_jax.data.prepare`)")
  manifest = read_manifest(directory)
  if manifest is None:
    if os.path.isdir(os.path.join(directory, PARTIAL)):
      raise NotPreparedError(f"{directory}/{MANIFEST} not found: its preparation did not finish ({PARTIAL}/ holds "
                             "it); rerun the same `python -m elmo_jax.data.prepare` command to resume it")
    raise NotPreparedError(f"{directory}/{MANIFEST} not found: not a prepared corpus (run "
                           "`python -m elmo_jax.data.prepare`), or its preparation did not finish")
  verify_files(directory, manifest, checksums=checksums, use_cache=use_cache, log_line=log_line)
  return manifest


def verify(directory: str) -> str | None:
  """None if a prepared directory is intact (`open_verified`, every file hashed, the cache neither read nor
  written); else what is wrong, in one line naming the file."""
  try:
    open_verified(directory, use_cache=False, log_line=lambda _: None)
  except PreparedCorpusError as e:
    return str(e)
  return None
