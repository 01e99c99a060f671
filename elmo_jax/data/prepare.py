"""Tokenize a corpus once: `python -m elmo_jax.data.prepare --input=... --output_dir=...`.

  python -m elmo_jax.data.prepare --input='corpus/*.txt.gz' --output_dir=prepared/corpus --num_workers=8
  python -m elmo_jax.data.prepare --tfds_name=lm1b --tfds_split=train --pretokenized --output_dir=prepared/lm1b

Output directory (what `config.data.prepared_dir` points at):
  tokens.npy       int32 [n_tokens]          every word of every sentence, as a type id, sentences back to back
  offsets.npy      int64 [n_sentences + 1]   sentence s is tokens[offsets[s]:offsets[s + 1]] (may be empty)
  types.txt        the full type inventory, one per line: ids 0, 1, 2 are <S>, </S>, <UNK>, then every
                   distinct token by count (descending), then token -- so out-of-vocabulary words keep their
                   own characters for the char CNN
  type_counts.npy  int64 [n_types]
  type_chars.npy   uint16 [n_types, max_characters_per_token] bilm-tf char ids of each type (cut to
                   max_token_chars characters first, as the raw-text pipeline does)
  vocab.txt, vocab_counts.tsv   the softmax vocabulary in bilm-tf's format (a prefix of the type ranking,
                   exactly what `Vocab.build` makes from the same sentences), or a copy of --vocab_file
  manifest.json    counts, settings, the input files, the size and sha256 of every file above (written last)

Why flat `.npy` arrays: they memory-map, so a trainer opens an 800M-token corpus instantly and a batch is a
handful of vectorized numpy gathers (no per-token Python, no record decoding); the sentence index stays the
random-access line number, so the trainer's shuffle and data position are exactly the raw-text path's.

The sentences are tokenized in fixed chunks (`--chunk_sentences`) by `--num_workers` processes; each finished
chunk is kept in `output_dir/.partial/`, so a killed run resumes where it stopped, and the merge ranks types
from the chunks' counts alone: the output is byte-identical for any number of workers.

Every reader opens a prepared directory through `open_verified` (`PreparedCorpus` does): the manifest must be
one of this format, every file must have its recorded size, and its sha256 must equal the manifest's. A
file's hash is remembered in `$ELMO_JAX_CACHE/prepared-verified/` (see `open_verified`), so an unchanged
directory is hashed once, not at every start; the directory itself is never written to when opened.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

from elmo_jax import files
from elmo_jax import log
from elmo_jax.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, UNK_TOKEN, token_to_ids
from elmo_jax.data.sources import TextSource, TfdsSource, expand_paths
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.data.vocab import Vocab
from elmo_jax.progress import progress

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARTIAL = ".partial"
SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
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


def source_spec(inputs: Sequence[str] = (), tfds_name: str = "", tfds_split: str = "train",
                tfds_data_dir: str = "", tfds_text_key: str = "text") -> dict[str, Any]:
  """What identifies the input: files with size and mtime, or the TFDS dataset and split."""
  if tfds_name:
    return {"kind": "tfds", "name": tfds_name, "split": tfds_split, "data_dir": tfds_data_dir or "",
            "text_key": tfds_text_key}
  if not inputs:
    raise PrepareError("no input: pass --input=FILES_OR_GLOBS (comma-separated) or --tfds_name")
  try:
    paths = expand_paths(list(inputs))
  except (FileNotFoundError, ValueError) as e:
    raise PrepareError(str(e)) from None
  return {"kind": "text", "files": [{"path": os.path.abspath(p), "size": os.path.getsize(p),
                                     "mtime_ns": os.stat(p).st_mtime_ns} for p in paths]}


def open_source(spec: dict[str, Any]):
  try:
    if spec["kind"] == "tfds":
      return TfdsSource(spec["name"], spec["split"], data_dir=spec["data_dir"] or None, text_key=spec["text_key"])
    return TextSource([f["path"] for f in spec["files"]])
  except (ValueError, OSError) as e:
    raise PrepareError(str(e).splitlines()[0]) from None


def check_inputs(spec: dict[str, Any]) -> None:
  """Refuses, before anything is created, text inputs that cannot be a corpus: binary ones (an HDF5 file,
  NUL bytes, not UTF-8: `files.text_problem`) and an input that is empty (0 bytes in all)."""
  if spec["kind"] != "text":
    return
  for f in spec["files"]:
    problem = files.text_problem(f["path"])
    if problem:
      raise PrepareError(f"{f['path']} {problem}")
  if not any(f["size"] for f in spec["files"]):
    raise PrepareError(f"input {_describe(spec)} is empty (0 bytes)")


def _describe_source(spec: Any) -> str:
  try:
    return _describe(spec)
  except (KeyError, TypeError):  # a damaged settings.json
    return json.dumps(spec)[:80]


def _when(mtime_ns: Any) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mtime_ns / 1e9)) if isinstance(mtime_ns, int) else "?"


def _source_difference(saved: Any, wanted: Any) -> str:
  """'source is A there, B here' / 'source file F changed (...)': how two inputs differ; "" if they agree."""
  if saved == wanted:
    return ""
  if not (isinstance(saved, dict) and isinstance(wanted, dict)) or saved.get("kind") != wanted.get("kind"):
    return f"source is {_describe_source(saved)} there, {_describe_source(wanted)} here"
  if saved["kind"] == "tfds":
    return files.first_difference(saved, wanted, "source.")
  a, b = saved.get("files") or [], wanted.get("files") or []
  if [f.get("path") for f in a] != [f.get("path") for f in b]:
    return f"source is {_describe_source(saved)} there, {_describe_source(wanted)} here"
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


# --- pass 1: tokenize fixed chunks in worker processes ------------------------------------------------
_WORKER: dict[str, Any] = {}  # set before the pool forks; workers inherit the opened source


def _chunk_path(work: str, k: int) -> str:
  return os.path.join(work, f"chunk-{k:05d}.npz")


def _tokenize_chunk(k: int) -> tuple[int, int]:
  """Tokenizes sentences [k * C, (k + 1) * C) into chunk k's local types, counts, ids and lengths."""
  source, tokenizer, work, size = (_WORKER[key] for key in ("source", "tokenizer", "work", "chunk"))
  local: dict[str, int] = {}
  ids: list[int] = []
  lengths = []
  for i in range(k * size, min((k + 1) * size, len(source))):
    tokens = tokenizer(source[i])
    lengths.append(len(tokens))
    ids.extend(local.setdefault(t, len(local)) for t in tokens)
  ids_arr = np.asarray(ids, np.int32)
  counts = np.bincount(ids_arr, minlength=len(local)).astype(np.int64)
  types = np.frombuffer("\n".join(local).encode("utf-8"), np.uint8)
  with files.atomic_path(_chunk_path(work, k), suffix=".tmp.npz") as tmp:
    np.savez(tmp, types=types, counts=counts, ids=ids_arr, lengths=np.asarray(lengths, np.int32))
  return k, len(ids)


def _read_chunk(work: str, k: int) -> dict[str, np.ndarray]:
  with np.load(_chunk_path(work, k)) as z:
    chunk = {key: z[key] for key in z.files}
  chunk["types"] = bytes(chunk["types"]).decode("utf-8").split("\n") if len(chunk["counts"]) else []
  return chunk


def _ignore_sigint() -> None:
  """Pool initializer: Ctrl-C reaches the whole process group; only the parent reports it (the pool is then
  terminated), the workers do not each print a traceback."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def _open_in_worker(spec, tokenizer, work: str, chunk: int) -> None:
  _ignore_sigint()
  _WORKER.update(source=open_source(spec), tokenizer=tokenizer, work=work, chunk=chunk)


def _make_pool(spec, tokenizer, work: str, chunk: int, num_workers: int):
  """Worker processes that ignore SIGINT from their first instruction (the disposition is inherited)."""
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    # Text: fork, the workers inherit the read corpus (read once, not once per worker). TFDS: ArrayRecord
    # readers do not survive a fork; spawned workers open the dataset themselves.
    if spec["kind"] == "text":
      return multiprocessing.get_context("fork").Pool(num_workers, initializer=_ignore_sigint)
    return multiprocessing.get_context("spawn").Pool(
        num_workers, initializer=_open_in_worker, initargs=(spec, tokenizer, work, chunk))
  finally:
    signal.signal(signal.SIGINT, previous)


def _tokenize_all(spec, source, tokenizer, work: str, chunk: int, num_workers: int, log_line) -> None:
  n_chunks = -(-len(source) // chunk)
  for name in os.listdir(work):  # a chunk's temporary file, left by a worker terminated while writing it
    if name.startswith("chunk-") and name.endswith(".tmp.npz"):
      os.remove(os.path.join(work, name))
  todo = [k for k in range(n_chunks) if not os.path.exists(_chunk_path(work, k))]
  if len(todo) < n_chunks:
    log_line(f"resuming: kept {n_chunks - len(todo)} of {n_chunks} finished chunks in {work}")
  _WORKER.update(source=source, tokenizer=tokenizer, work=work, chunk=chunk)
  bar = progress(desc="tokenizing", total=len(todo) * chunk, unit="sent")
  try:
    if num_workers <= 1 or len(todo) <= 1:
      results = map(_tokenize_chunk, todo)
      for _ in results:
        bar.update(chunk)
    else:
      with _make_pool(spec, tokenizer, work, chunk, num_workers) as pool:  # terminated on any exception
        for _ in pool.imap_unordered(_tokenize_chunk, todo):
          bar.update(chunk)
  finally:
    bar.close()
    _WORKER.clear()


# --- pass 2: rank the types from the chunk counts, remap the ids ---------------------------------------
def _rank_types(work: str, n_chunks: int) -> tuple[list[str], np.ndarray]:
  counter: dict[str, int] = {}
  for k in progress(range(n_chunks), desc="counting types", unit="chunk"):
    chunk = _read_chunk(work, k)
    get = counter.get
    for t, c in zip(chunk["types"], chunk["counts"].tolist()):
      counter[t] = get(t, 0) + c
  # A literal "<S>" in the text is the same token as the special one (same chars, same softmax id).
  special_counts = [counter.pop(s, 0) for s in SPECIALS]
  ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))
  types = list(SPECIALS) + [t for t, _ in ranked]
  counts = np.asarray(special_counts + [c for _, c in ranked], np.int64)
  return types, counts


def _build_vocab(types: list[str], counts: np.ndarray, n_sentences: int, max_size: int | None,
                 min_count: int) -> Vocab:
  """`Vocab.build` of the same sentences, from the ranked types (specials in the text are not counted)."""
  body, body_counts = types[3:], counts[3:]
  keep = int(np.count_nonzero(body_counts >= min_count))  # ranked by count, so a prefix
  if max_size is not None:
    keep = min(keep, max_size - len(SPECIALS))
  n_unk = int(body_counts.sum() - body_counts[:keep].sum())
  return Vocab(list(SPECIALS) + body[:keep], [0, n_sentences, n_unk] + body_counts[:keep].tolist())


def _merge(work: str, out: str, n_chunks: int, n_sentences: int, settings: dict, log_line) -> dict[str, Any]:
  types, counts = _rank_types(work, n_chunks)
  index = {t: i for i, t in enumerate(types)}
  lengths = [_read_chunk(work, k)["lengths"] for k in range(n_chunks)]
  offsets = np.zeros([n_sentences + 1], np.int64)
  np.cumsum(np.concatenate(lengths) if lengths else [], out=offsets[1:])
  n_tokens = int(offsets[-1])
  if n_tokens == 0:  # before anything is written into `out`
    raise PrepareError(f"input {_describe(settings['source'])} has no tokens ({n_sentences:,} lines, all blank "
                       "after tokenizing)")
  with files.atomic_path(os.path.join(out, "tokens.npy"), suffix=".tmp.npy") as tmp:
    tokens = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(n_tokens,))
    at = 0
    for k in progress(range(n_chunks), desc="writing ids", unit="chunk"):
      chunk = _read_chunk(work, k)
      remap = np.fromiter((index[t] for t in chunk["types"]), np.int32, count=len(chunk["types"]))
      tokens[at : at + len(chunk["ids"])] = remap[chunk["ids"]]
      at += len(chunk["ids"])
    tokens.flush()
    del tokens
  with files.atomic_path(os.path.join(out, "offsets.npy"), suffix=".tmp.npy") as tmp:
    np.save(tmp, offsets)
  limit, max_chars = settings["max_token_chars"], settings["max_characters_per_token"]
  chars = np.zeros([len(types), max_chars], np.uint16)
  for i, t in enumerate(progress(types, desc="type chars", unit="type")):
    chars[i] = token_to_ids(t[:limit], max_chars)
  with files.atomic_path(os.path.join(out, "type_chars.npy"), suffix=".tmp.npy") as tmp:
    np.save(tmp, chars)
  with files.atomic_path(os.path.join(out, "type_counts.npy"), suffix=".tmp.npy") as tmp:
    np.save(tmp, counts)
  files.write_text(os.path.join(out, "types.txt"), "".join(t + "\n" for t in types))
  if "file" in settings["vocab"]:
    vocab = Vocab.load(settings["vocab"]["file"])
  else:
    vocab = _build_vocab(types, counts, n_sentences, settings["vocab"]["max_size"], settings["vocab"]["min_count"])
  vocab.save(out)
  n_empty = int(np.count_nonzero(np.diff(offsets) == 0))
  n_truncated = int(sum(c for t, c in zip(types, counts.tolist()) if len(t) > limit))
  return {"n_sentences": n_sentences, "n_empty_sentences": n_empty, "n_tokens": n_tokens,
          "n_types": len(types), "n_truncated_tokens": n_truncated, "vocab_size": len(vocab),
          "vocab_sha256": vocab.sha256(), "oov_tokens": int(counts.sum() - sum(
              c for t, c in zip(types, counts.tolist()) if t in vocab))}


# --- reading a prepared directory: one verified opener ----------------------------------------------------
AGAIN = "prepare it again into a new directory"
VERIFY_CACHE = "prepared-verified"  # under $ELMO_JAX_CACHE: the files' last successful sha256 checks


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


def _read_partial_settings(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise PrepareError(f"{path} cannot be read as JSON ({str(e).splitlines()[0]}); delete "
                       f"{os.path.dirname(path)} to start over") from None
  if not isinstance(saved, dict):
    raise PrepareError(f"{path} is not a settings object; delete {os.path.dirname(path)} to start over")
  return saved


# A few lines over 60, most of them the signature and docstring of the public entry point.
def prepare(output_dir: str, inputs: Sequence[str] = (), *, tfds_name: str = "", tfds_split: str = "train",
            tfds_data_dir: str = "", tfds_text_key: str = "text", pretokenized: bool = False, lang: str = "en",
            max_token_chars: int = 50, max_characters_per_token: int = MAX_CHARS,
            vocab_max_size: int | None = 100_000, vocab_min_count: int = 1, vocab_file: str = "",
            num_workers: int = 1, chunk_sentences: int = 100_000,
            log_line: Callable[[str], None] = log.info) -> dict[str, Any]:
  """Prepares `output_dir` (see the module docstring); returns its manifest. Idempotent and resumable.

  Every input is checked before anything is created in `output_dir`; a corpus refused after the work
  started (no tokens) leaves nothing behind. A finished `output_dir` is verified (`open_verified`), not
  trusted. Ctrl-C raises a plain KeyboardInterrupt in the calling process (the workers ignore SIGINT and
  are terminated); the finished chunks stay for the rerun.

  Raises:
    PrepareError: missing/empty/binary input (or one most of whose lines are not UTF-8), a corpus without
      tokens, a vocab_file without the specials, an output_dir that holds another corpus or other settings
      (one line naming what differs, the corpus first), or a finished output_dir whose files no longer
      match its manifest (PreparedCorpusError naming the file).
  """
  if chunk_sentences < 1 or num_workers < 1 or max_token_chars < 1:
    raise PrepareError("--chunk_sentences, --num_workers and --max_token_chars must be >= 1")
  spec = source_spec(inputs, tfds_name, tfds_split, tfds_data_dir, tfds_text_key)
  check_inputs(spec)
  if vocab_file:
    if not os.path.isfile(vocab_file):
      raise PrepareError(f"{vocab_file}: vocab file not found")
    try:
      Vocab.load(vocab_file)
    except ValueError as e:
      raise PrepareError(str(e).splitlines()[0]) from None
  settings = settings_of(spec, pretokenized, lang, max_token_chars, max_characters_per_token, vocab_max_size,
                         vocab_min_count, vocab_file)
  out = os.path.abspath(output_dir)
  work = os.path.join(out, PARTIAL)
  manifest = read_manifest(out) if os.path.isdir(out) else None
  if manifest is not None:
    diff = settings_difference(manifest["settings"], settings)
    if diff:
      raise PrepareError(f"{out} holds another prepared corpus ({diff}); use another --output_dir or delete it")
    verify_files(out, manifest, log_line=log_line)
    if os.path.isdir(work):  # left by a run killed between writing the manifest and removing it
      shutil.rmtree(work, ignore_errors=True)
    log_line(f"{out} is already prepared ({manifest['counts']['n_tokens']:,} tokens, verified); nothing to do")
    return manifest
  settings_path = os.path.join(work, "settings.json")
  if os.path.exists(settings_path):
    saved = _read_partial_settings(settings_path)
    diff = settings_difference({k: v for k, v in saved.items() if k != "chunk_sentences"}, settings)
    if diff:
      what = "another corpus" if diff.startswith("source") else "other settings"
      raise PrepareError(f"{out} holds an unfinished preparation of {what} ({diff}); use another --output_dir or "
                         "delete it")
    if saved.get("chunk_sentences") != chunk_sentences:
      raise PrepareError(f"{out} holds an unfinished preparation of this corpus in chunks of "
                         f"{json.dumps(saved.get('chunk_sentences'))[:20]} sentences; rerun with --chunk_sentences="
                         f"{json.dumps(saved.get('chunk_sentences'))[:20]} to resume it, or delete {work}")
  elif os.path.isdir(out) and set(os.listdir(out)) - {PARTIAL}:  # a .partial without settings holds nothing
    raise PrepareError(f"{out} is not empty and holds no prepared corpus; use another --output_dir")
  try:
    files.check_output(out, "--output_dir", directory=True,
                       inputs=[f["path"] for f in spec.get("files", [])] + ([vocab_file] if vocab_file else []))
  except files.UnsafeOutputError as e:
    raise PrepareError(str(e)) from None
  started = time.time()
  source = open_source(spec)  # reads (and checks) the text before anything is created
  created_out = not os.path.exists(out)
  os.makedirs(work, exist_ok=True)
  files.write_json(settings_path, {**settings, "chunk_sentences": chunk_sentences})
  try:
    tokenizer = Tokenizer(pretokenized=pretokenized, lang=lang)
    _tokenize_all(spec, source, tokenizer, work, chunk_sentences, num_workers, log_line)
    tokenized = time.time()
    n_chunks = -(-len(source) // chunk_sentences)
    counts = _merge(work, out, n_chunks, len(source), settings, log_line)
  except PrepareError:  # a refused corpus (no tokens): its chunks could only be refused again
    shutil.rmtree(work, ignore_errors=True)
    if created_out:
      with contextlib.suppress(OSError):
        os.rmdir(out)
    raise
  before = {name: os.stat(os.path.join(out, name)) for name in OUTPUT_FILES}
  digests = {name: files.sha256_file(os.path.join(out, name)) for name in OUTPUT_FILES}
  manifest = {"settings": settings, "counts": counts,
              "skipped_lines": dict(getattr(source, "skipped", {})),
              "sizes": {name: before[name].st_size for name in OUTPUT_FILES}, "sha256": digests}
  files.write_json(os.path.join(out, MANIFEST), manifest)
  shutil.rmtree(work)
  # The hashes just taken are the first verification: the first reader does not hash the files again.
  _remember_verified(out, {name: {**_file_key(before[name]), "sha256": digests[name]} for name in OUTPUT_FILES
                           if _file_key(os.stat(os.path.join(out, name))) == _file_key(before[name])}, log_line)
  elapsed = time.time() - started
  log_line(f"prepared {counts['n_sentences']:,} sentences, {counts['n_tokens']:,} tokens, {counts['n_types']:,} "
           f"types (vocab {counts['vocab_size']:,}) in {elapsed:.1f}s (tokenizing {tokenized - started:.1f}s, "
           f"{counts['n_tokens'] / max(tokenized - started, 1e-9):,.0f} tokens/s) -> {out}")
  return manifest


def _describe(spec: dict[str, Any]) -> str:
  if spec["kind"] == "tfds":
    return f"tfds {spec['name']}/{spec['split']}"
  return ", ".join(f["path"] for f in spec["files"][:3]) + (" ..." if len(spec["files"]) > 3 else "")


def verify(directory: str) -> str | None:
  """None if a prepared directory is intact (`open_verified`, every file hashed, the cache neither read nor
  written); else what is wrong, in one line naming the file."""
  try:
    open_verified(directory, use_cache=False, log_line=lambda _: None)
  except PreparedCorpusError as e:
    return str(e)
  return None


def main(argv: Sequence[str]) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  from elmo_jax import progress as progress_lib  # pylint: disable=g-import-not-at-top
  if not f.progress:
    progress_lib.set_enabled(False)
  inputs = [p.strip() for p in (f.input or "").split(",") if p.strip()]
  try:
    prepare(f.output_dir, inputs, tfds_name=f.tfds_name, tfds_split=f.tfds_split, tfds_data_dir=f.tfds_data_dir,
            tfds_text_key=f.tfds_text_key, pretokenized=f.pretokenized, max_token_chars=f.max_token_chars,
            vocab_max_size=f.vocab_max_size or None, vocab_min_count=f.vocab_min_count,
            vocab_file=f.vocab_file, num_workers=f.num_workers, chunk_sentences=f.chunk_sentences)
  except PrepareError as e:
    sys.exit(f"prepare: {e}")
  except KeyboardInterrupt:  # the workers ignore SIGINT: this is the only report
    work = os.path.join(os.path.abspath(f.output_dir), PARTIAL)
    kept = (f"rerun the same command to resume (finished chunks are kept in {work})" if os.path.isdir(work)
            else "nothing was written")
    print(f"prepare: interrupted; {kept}", file=sys.stderr, flush=True)
    sys.exit(130)


def _define_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("input", None, "Comma-separated text files or globs (.gz ok), one sentence per line.")
  flags.DEFINE_string("tfds_name", "", "A TFDS dataset (ArrayRecord, read without TensorFlow), e.g. lm1b.")
  flags.DEFINE_string("tfds_split", "train", "TFDS split.")
  flags.DEFINE_string("tfds_data_dir", "", "TFDS data_dir (default: TFDS's).")
  flags.DEFINE_string("tfds_text_key", "text", "Feature holding the sentence.")
  flags.DEFINE_string("output_dir", None, "Directory for the prepared corpus (created; resumable).")
  flags.DEFINE_bool("pretokenized", False, "Lines are already tokenized: split on whitespace (else Moses).")
  flags.DEFINE_integer("max_token_chars", 50, "Longer tokens are cut to this many characters for the char CNN.")
  flags.DEFINE_integer("vocab_max_size", 100_000, "Softmax vocabulary size incl. <S>, </S>, <UNK> (0 = all).")
  flags.DEFINE_integer("vocab_min_count", 1, "Tokens seen fewer times are <UNK> in the softmax.")
  flags.DEFINE_string("vocab_file", "", "Use this vocab.txt (bilm-tf format) instead of building one.")
  flags.DEFINE_integer("num_workers", max(1, (os.cpu_count() or 2) - 1), "Tokenizer processes.")
  flags.DEFINE_integer("chunk_sentences", 100_000, "Sentences per resumable chunk (not part of the output).")
  flags.DEFINE_bool("progress", True, "Progress bars on stderr.")
  flags.mark_flags_as_required(["output_dir"])


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main)
