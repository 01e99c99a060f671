"""A prepared corpus directory's manifest (its schema, the sizes and sha256 of its files) and the one verified
opener every reader goes through; the settings a manifest records are `prepare_settings`'.

`open_verified(D)` (used by `PreparedCorpus`, the trainer's preflight, `evaluate.py --text_file=D` and
`prepare`'s own rerun): `manifest.json` must be a manifest of this format, every file it lists must have its
recorded size (always checked), and its sha256 must equal the manifest's. A file's hash is remembered in
`$ELMO_JAX_CACHE/prepared-verified/` with its size, mtime and ctime, so an unchanged directory is hashed once,
not at every start; the directory itself is never written to when opened (it may be read-only).

The manifest is the root of trust: it cannot hash itself, so an edit of its settings cannot be caught by a
checksum. Two things bound what such an edit can do:
  - every setting a reader uses is schema-checked (`_check_manifest`: format_version, tokenizer.pretokenized
    a bool, tokenizer.lang a string, max_token_chars an int >= 1, max_characters_per_token an int >= 3, the
    vocab settings, the counts ints >= 0), one line naming the key; `PreparedCorpus` then checks the counts
    against the arrays (and counts.n_truncated_tokens against max_token_chars and the type table);
  - the verification cache entry records the manifest's own stat (size, mtime, ctime) and sha256 (of its
    parsed content) beside the files' ones: any edit of manifest.json after a verification makes the next
    open hash every file again, as if never verified.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable

from elmo_jax.runtime import cache
from elmo_jax.runtime import files
from elmo_jax.runtime import log
from elmo_jax.runtime import outside_names
from elmo_jax.runtime import storage
from elmo_jax.runtime.progress import progress

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


def _damaged(path: str, what: str) -> PreparedCorpusError:
  return PreparedCorpusError(f"{path} {what}; {AGAIN}")


def _is_int(value: Any, low: int | None = None) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def _bad_setting(key: str, value: Any, wanted: str) -> str:
  return f"has settings.{key} = {json.dumps(value)[:60]}, not {wanted}"


def _settings_problem(settings: dict[str, Any]) -> str | None:
  """What is wrong with the settings a reader uses (one phrase naming the key), None if they are sound."""
  tokenizer = settings.get("tokenizer")
  if not isinstance(tokenizer, dict):
    return _bad_setting("tokenizer", tokenizer, "an object")
  if not isinstance(tokenizer.get("pretokenized"), bool):
    return _bad_setting("tokenizer.pretokenized", tokenizer.get("pretokenized"), "true or false")
  if not isinstance(tokenizer.get("lang"), str):
    return _bad_setting("tokenizer.lang", tokenizer.get("lang"), "a language code")
  if not _is_int(settings.get("max_token_chars"), 1):
    return _bad_setting("max_token_chars", settings.get("max_token_chars"), "an integer >= 1")
  if not _is_int(settings.get("max_characters_per_token"), 3):
    return _bad_setting("max_characters_per_token", settings.get("max_characters_per_token"), "an integer >= 3")
  source = settings.get("source")
  if not (isinstance(source, dict) and source.get("kind") in ("text", "tfds") and (
      source["kind"] == "tfds" or (isinstance(source.get("files"), list) and all(
          isinstance(f, dict) and isinstance(f.get("path"), str) for f in source["files"])))):
    return _bad_setting("source", source, "a text or tfds input")
  vocab = settings.get("vocab")
  if not isinstance(vocab, dict):
    return _bad_setting("vocab", vocab, "an object")
  if "file" in vocab:
    if not isinstance(vocab["file"], str) or not vocab["file"]:
      return _bad_setting("vocab.file", vocab["file"], "a path")
    if not (isinstance(vocab.get("sha256"), str) and len(vocab["sha256"]) == 64):
      return _bad_setting("vocab.sha256", vocab.get("sha256"), "a file's sha256")
    return None
  if not (vocab.get("max_size") is None or _is_int(vocab["max_size"], 4)):
    return _bad_setting("vocab.max_size", vocab.get("max_size"), "null or an integer >= 4")
  if not _is_int(vocab.get("min_count"), 1):
    return _bad_setting("vocab.min_count", vocab.get("min_count"), "an integer >= 1")
  return None


# Counts every manifest of this format has (the others are checked when present).
_REQUIRED_COUNTS = ("n_sentences", "n_tokens", "n_types")
_OPTIONAL_COUNTS = ("n_empty_sentences", "n_truncated_tokens", "vocab_size", "oov_tokens")


def _check_manifest(path: str, manifest: Any) -> dict[str, Any]:
  """`manifest` if it is a manifest of this format, else PreparedCorpusError saying what is wrong (one line
  naming the key): the settings every reader uses, the counts, the files' sizes and sha256."""
  if not isinstance(manifest, dict):
    raise _damaged(path, f"is not a prepared corpus's manifest (a JSON {type(manifest).__name__}, not an object)")
  for key in ("settings", "counts", "sha256"):
    if not isinstance(manifest.get(key), dict):
      raise _damaged(path, f"is not a prepared corpus's manifest (no {key!r} object)")
  settings, counts, digests = manifest["settings"], manifest["counts"], manifest["sha256"]
  if settings.get("format_version") != FORMAT_VERSION or isinstance(settings.get("format_version"), bool):
    raise _damaged(path, f"is of format_version {json.dumps(settings.get('format_version'))[:40]}; this version "
                         f"reads {FORMAT_VERSION}")
  problem = _settings_problem(settings)
  if problem:
    raise _damaged(path, problem)
  for key in _REQUIRED_COUNTS + tuple(k for k in _OPTIONAL_COUNTS if k in counts):
    if not _is_int(counts.get(key), 0):
      raise _damaged(path, f"has counts.{key} = {json.dumps(counts.get(key))[:40]}, not a count")
  if "vocab_sha256" in counts and not (isinstance(counts["vocab_sha256"], str) and len(counts["vocab_sha256"]) == 64):
    raise _damaged(path, f"has counts.vocab_sha256 = {json.dumps(counts['vocab_sha256'])[:70]}, not a sha256")
  skipped = manifest.get("skipped_lines", {})
  if not (isinstance(skipped, dict) and all(isinstance(k, str) and _is_int(v, 0) for k, v in skipped.items())):
    raise _damaged(path, f"has skipped_lines = {json.dumps(skipped)[:60]}, not counts of skipped lines")
  for name in OUTPUT_FILES:
    if name not in digests:
      raise _damaged(path, f"lists no sha256 of {name}")
  sizes = manifest.get("sizes", {})  # absent in manifests written before sizes were recorded
  for name, digest in digests.items():
    try:  # a name from the manifest is a file of the folder, never a path out of it
      outside = outside_names.name_parts(name, "a file name") != [name]
    except outside_names.OutsideNameError:
      outside = True
    if outside or not (isinstance(digest, str) and len(digest) == 64):
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
  return os.path.join(cache.cache_dir(), VERIFY_CACHE, hashlib.sha256(real.encode()).hexdigest()[:16] + ".json")


def _manifest_key(directory: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
  """The manifest's own entry in the cache: manifest.json's size, mtime and ctime, and the sha256 of the
  manifest as parsed (canonical JSON, so the key vouches for exactly the settings the caller read). None if
  manifest.json cannot be stat'ed."""
  try:
    st = os.stat(os.path.join(directory, MANIFEST))
  except OSError:
    return None
  digest = hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
  return {**files.stat_key(st), "sha256": digest}


def _load_verified(cache_path: str, real: str, manifest_key: dict[str, Any] | None) -> dict[str, Any]:
  """The files' cached checks, if the cache was written for this very manifest.json (`_manifest_key`);
  else {}: a manifest edited since (its settings included) has every file hashed again."""
  try:
    with open(cache_path, encoding="utf-8") as f:
      cached = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(cached, dict) or cached.get("directory") != real or not isinstance(cached.get("files"), dict):
    return {}
  if manifest_key is None or cached.get("manifest") != manifest_key:
    return {}
  return dict(cached["files"])


def _save_verified(cache_path: str, real: str, entries: dict[str, Any], manifest_key: dict[str, Any] | None,
                   log_line) -> None:
  try:
    files.write_json(cache_path, {"directory": real, "manifest": manifest_key, "files": entries})
  except OSError as e:  # an unwritable cache costs a re-hash next time, nothing else
    log_line(f"cannot record the verification of {real} in {cache_path} ({e.strerror or e}): it is hashed again "
             "at the next start")


def write_manifest(out: str, fields: dict[str, Any], log_line: Callable[[str], None] = log.info) -> dict[str, Any]:
  """Writes `out/manifest.json` (the last file of a preparation): `fields` plus the size and sha256 of every
  output file; the hashes just taken count as the first verification, so the first reader does not hash the
  files again. Returns the manifest."""
  before = {name: os.stat(os.path.join(out, name)) for name in OUTPUT_FILES}
  digests = {name: files.sha256_file(os.path.join(out, name)) for name in OUTPUT_FILES}
  manifest = {**fields, "sizes": {name: before[name].st_size for name in OUTPUT_FILES}, "sha256": digests}
  files.write_json(os.path.join(out, MANIFEST), manifest)
  real = os.path.realpath(out)
  key = _manifest_key(out, manifest)
  _save_verified(_verify_cache_path(real), real, {
      name: {**files.stat_key(before[name]), "sha256": digests[name]} for name in OUTPUT_FILES
      if files.stat_key(os.stat(os.path.join(out, name))) == files.stat_key(before[name])}, key, log_line)
  return manifest


def verify_files(directory: str, manifest: dict[str, Any], *, checksums: bool = True, use_cache: bool = True,
                 log_line: Callable[[str], None] = log.info) -> None:
  """Checks every file `manifest` lists: present, a regular file, of the recorded size and (`checksums`) of
  the recorded sha256. Hashes only the files the cache does not vouch for (`files.stat_key`), and records the
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
  manifest_key = _manifest_key(directory, manifest) if use_cache else None
  cached = _load_verified(cache_path, real, manifest_key) if use_cache else {}
  todo = [n for n in stats if cached.get(n) != {**files.stat_key(stats[n]), "sha256": digests[n]}]
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
        digest = files.sha256_file(path, on_block=bar.update)
        after = os.stat(path)
      except OSError as e:
        raise PreparedCorpusError(f"{path} cannot be read ({e.strerror or e})") from None
      if digest != digests[name]:
        raise PreparedCorpusError(f"{path} fails its sha256 checksum (it differs from {MANIFEST}'s: the file changed "
                                  f"after preparing); {AGAIN}")
      if files.stat_key(after) == files.stat_key(stats[name]):  # not being written while it was read
        cached[name] = {**files.stat_key(after), "sha256": digest}
  finally:
    bar.close()
    if use_cache:
      _save_verified(cache_path, real, cached, manifest_key, log_line)
  log_line(f"verified {directory}: sha256 of {len(todo)} of {len(stats)} files, {files.human_bytes(total)}, in "
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
  bytes that touches neither (bit rot on the disk) is not: `verify(directory)` hashes everything. The cache
  entry also records manifest.json's own size, mtime, ctime and sha256: after an edit of the manifest, every
  file is hashed again. `use_cache=False` neither reads nor writes the cache.

  Raises:
    NotPreparedError (a FileNotFoundError): no manifest.json (not prepared, or unfinished).
    PreparedCorpusError (an OSError): a damaged manifest, or a file missing, of another size or sha256;
      one line naming the file.
  """
  try:
    directory = os.path.abspath(storage.local(directory))  # in a bucket: a local copy, verified as any folder
  except FileNotFoundError as e:
    raise NotPreparedError(f"{e}: not a prepared corpus") from None
  if not os.path.isdir(directory):
    raise NotPreparedError(f"{directory}: no such directory, not a prepared corpus (run "
                           "`elmo-jax prepare`)")
  manifest = read_manifest(directory)
  if manifest is None:
    if os.path.isdir(os.path.join(directory, PARTIAL)):
      raise NotPreparedError(f"{directory}/{MANIFEST} not found: its preparation did not finish ({PARTIAL}/ holds "
                             "it); rerun the same `elmo-jax prepare` command to resume it")
    raise NotPreparedError(f"{directory}/{MANIFEST} not found: not a prepared corpus (run "
                           "`elmo-jax prepare`), or its preparation did not finish")
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
