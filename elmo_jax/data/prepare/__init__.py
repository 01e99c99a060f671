"""Tokenize a corpus once: `elmo-jax prepare --input=... --output_dir=...`.

  elmo-jax prepare --input='corpus/*.txt.gz' --output_dir=prepared/corpus --num_workers=8
  elmo-jax prepare --tfds_name=lm1b --tfds_split=train --pretokenized --output_dir=prepared/lm1b

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
                   exactly what `Vocab.build` makes from the same sentences), or a copy of --vocab_file: its
                   tokens in its order (the same `Vocab.sha256`), with the counts beside it, or, for a plain
                   bilm-tf vocab.txt without a vocab_counts.tsv, its tokens' counts in this corpus
  manifest.json    counts, settings, the input files, the size and sha256 of every file above (written last)

Why flat `.npy` arrays: they memory-map, so a trainer opens an 800M-token corpus instantly and a batch is a
handful of vectorized numpy gathers (no per-token Python, no record decoding); the sentence index stays the
random-access line number, so the trainer's shuffle and data position are exactly the raw-text path's.

The sentences are tokenized in fixed chunks (`--chunk_sentences`) by `--num_workers` processes; each finished
chunk is kept in `output_dir/.partial/`, so a killed run resumes where it stopped, and the merge ranks types
from the chunks' counts alone: the output is byte-identical for any number of workers.

Every reader opens a prepared directory through `elmo_jax.data.manifest.open_verified`. The command's flags
are `elmo_jax/cli/prepare.py`.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import time
from typing import Any, Callable, Sequence

import numpy as np

from elmo_jax.runtime import files
from elmo_jax.runtime import storage
from elmo_jax.runtime import log
from elmo_jax.data.chars import BOS_TOKEN, EOS_TOKEN, MAX_CHARS, UNK_TOKEN, is_cut, token_to_ids
from elmo_jax.data.manifest import PARTIAL, PrepareError, read_manifest, verify_files, write_manifest
from elmo_jax.data.prepare_inputs import check_inputs, check_numbers, check_vocab_file, open_source, source_spec
from elmo_jax.data.prepare_settings import describe_source, settings_difference, settings_of
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.data.vocab import Vocab
from elmo_jax.runtime.progress import progress

SPECIALS = (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)



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


def _count_vocab(vocab: Vocab, types: list[str], counts: np.ndarray, n_sentences: int) -> Vocab:
  """`vocab` (same tokens in the same order, so the same `Vocab.sha256`) with the counts `_build_vocab` gives:
  each word's count in the corpus, `<S>` 0, `</S>` the sentences, `<UNK>` every token not in `vocab`."""
  count_of = dict(zip(types[3:], counts[3:].tolist()))  # specials in the text are not counted (`Vocab.build`)
  special = {BOS_TOKEN: 0, EOS_TOKEN: n_sentences,
             UNK_TOKEN: int(counts[3:].sum()) - sum(c for t, c in count_of.items() if t in vocab)}
  return Vocab(vocab.tokens, [special[t] if t in special else count_of.get(t, 0) for t in vocab.tokens])


def _merge(work: str, out: str, n_chunks: int, n_sentences: int, settings: dict, log_line) -> dict[str, Any]:
  types, counts = _rank_types(work, n_chunks)
  index = {t: i for i, t in enumerate(types)}
  lengths = [_read_chunk(work, k)["lengths"] for k in range(n_chunks)]
  offsets = np.zeros([n_sentences + 1], np.int64)
  np.cumsum(np.concatenate(lengths) if lengths else [], out=offsets[1:])
  n_tokens = int(offsets[-1])
  if n_tokens == 0:  # before anything is written into `out`
    raise PrepareError(f"input {describe_source(settings['source'])} has no tokens ({n_sentences:,} lines, all blank "
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
  limit = settings["max_token_chars"]
  max_chars = settings["max_characters_per_token"]
  chars = np.zeros([len(types), max_chars], np.uint16)
  for i, token in enumerate(progress(types, desc="type chars", unit="type")):
    chars[i] = token_to_ids(token[:limit], max_chars)
  with files.atomic_path(os.path.join(out, "type_chars.npy"), suffix=".tmp.npy") as tmp:
    np.save(tmp, chars)
  with files.atomic_path(os.path.join(out, "type_counts.npy"), suffix=".tmp.npy") as tmp:
    np.save(tmp, counts)
  files.write_text(os.path.join(out, "types.txt"), "".join(t + "\n" for t in types))
  if "file" in settings["vocab"]:
    vocab = Vocab.load(settings["vocab"]["file"])
    if vocab.counts is None:  # a plain bilm-tf vocab.txt: its counts in this corpus, as `Vocab.build` counts
      vocab = _count_vocab(vocab, types, counts, n_sentences)
  else:
    vocab = _build_vocab(types, counts, n_sentences, settings["vocab"]["max_size"], settings["vocab"]["min_count"])
  vocab.save(out)
  n_empty = int(np.count_nonzero(np.diff(offsets) == 0))
  n_truncated = int(sum(c for t, c in zip(types, counts.tolist()) if is_cut(t, max_chars, limit)))
  return {"n_sentences": n_sentences, "n_empty_sentences": n_empty, "n_tokens": n_tokens,
          "n_types": len(types), "n_truncated_tokens": n_truncated, "vocab_size": len(vocab),
          "vocab_sha256": vocab.sha256(), "oov_tokens": int(counts.sum() - sum(
              c for t, c in zip(types, counts.tolist()) if t in vocab))}


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
    PrepareError: a number out of range (`check_numbers`; vocab_max_size None or 0 = no limit, else >= 4),
      missing/empty/binary input (or one most of whose lines are not UTF-8, or with CR-only line endings), a
      corpus without tokens, a vocab_file that is not a text vocabulary or lacks the specials
      (`check_vocab_file`), an output_dir that holds another corpus or other settings
      (one line naming what differs, the corpus first), or a finished output_dir whose files no longer
      match its manifest (PreparedCorpusError naming the file).
  """
  vocab_max_size = check_numbers(chunk_sentences=chunk_sentences, num_workers=num_workers,
                                 max_token_chars=max_token_chars, max_characters_per_token=max_characters_per_token,
                                 vocab_max_size=vocab_max_size, vocab_min_count=vocab_min_count)
  spec = source_spec(inputs, tfds_name, tfds_split, tfds_data_dir, tfds_text_key)
  check_inputs(spec)
  if vocab_file:
    check_vocab_file(vocab_file)
  settings = settings_of(spec, pretokenized, lang, max_token_chars, max_characters_per_token, vocab_max_size,
                         vocab_min_count, vocab_file)
  out = os.path.abspath(output_dir)
  work = os.path.join(out, PARTIAL)
  manifest = _finished(out, work, settings, log_line)
  if manifest is not None:
    return manifest
  settings_path = os.path.join(work, "settings.json")
  _check_unfinished(out, work, settings_path, settings, chunk_sentences)
  _check_output(out, spec, vocab_file)
  started = time.time()
  source = open_source(spec)  # reads (and checks) the text before anything is created
  created_out = not os.path.exists(out)
  os.makedirs(work, exist_ok=True)
  files.write_json(settings_path, {**settings, "chunk_sentences": chunk_sentences})
  tokenized, counts = _tokenize_and_merge(spec, source, out, settings, pretokenized, lang, chunk_sentences,
                                          num_workers, log_line, created_out)
  manifest = write_manifest(out, {"settings": settings, "counts": counts,
                                  "skipped_lines": dict(getattr(source, "skipped", {}))}, log_line)
  shutil.rmtree(work)
  elapsed = time.time() - started
  log_line(f"prepared {counts['n_sentences']:,} sentences, {counts['n_tokens']:,} tokens, {counts['n_types']:,} "
           f"types (vocab {counts['vocab_size']:,}) in {elapsed:.1f}s (tokenizing {tokenized - started:.1f}s, "
           f"{counts['n_tokens'] / max(tokenized - started, 1e-9):,.0f} tokens/s) -> {out}")
  return manifest


def _check_output(out: str, spec: dict[str, Any], vocab_file: str) -> None:
  """Raises PrepareError when the output directory `out` is unsafe to write (e.g. an input is inside it)."""
  try:
    storage.check_output(out, "output directory", directory=True,
                       inputs=[f["path"] for f in spec.get("files", [])] + ([vocab_file] if vocab_file else []))
  except files.UnsafeOutputError as e:  # "output directory=D ..." -> "output directory D ..."
    raise PrepareError(str(e).replace(f"output directory={out}", f"output directory {out}", 1)) from None


def _tokenize_and_merge(spec, source, out: str, settings: dict[str, Any], pretokenized: bool, lang: str,
                        chunk_sentences: int, num_workers: int, log_line: Callable[[str], None],
                        created_out: bool) -> tuple[float, dict[str, Any]]:
  """Passes 1 and 2 into `out`: (when tokenizing ended, the corpus counts). A refused corpus (PrepareError:
  no tokens) removes its chunks, and `out` when this run created it, before the error goes on."""
  work = os.path.join(out, PARTIAL)
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
  return tokenized, counts


def _finished(out: str, work: str, settings: dict[str, Any], log_line: Callable[[str], None]
              ) -> dict[str, Any] | None:
  """The verified manifest of `out` when it is already prepared with `settings`, None when it is not prepared.
  Raises PrepareError: `out` holds another corpus or other settings (PreparedCorpusError: damaged files)."""
  manifest = read_manifest(out) if os.path.isdir(out) else None
  if manifest is None:
    return None
  diff = settings_difference(manifest["settings"], settings)
  if diff:
    raise PrepareError(f"{out} holds another prepared corpus ({diff}); prepare into another directory or delete "
                       f"{out}")
  verify_files(out, manifest, log_line=log_line)
  if os.path.isdir(work):  # left by a run killed between writing the manifest and removing it
    shutil.rmtree(work, ignore_errors=True)
  log_line(f"{out} is already prepared ({manifest['counts']['n_tokens']:,} tokens, verified); nothing to do")
  return manifest


def _check_unfinished(out: str, work: str, settings_path: str, settings: dict[str, Any], chunk_sentences: int
                      ) -> None:
  """Raises PrepareError unless `out` is new, empty, or holds an unfinished run of these very settings
  (chunks included) that this run resumes."""
  if os.path.exists(settings_path):
    saved = _read_partial_settings(settings_path)
    diff = settings_difference({k: v for k, v in saved.items() if k != "chunk_sentences"}, settings)
    if diff:
      what = "another corpus" if diff.startswith("source") else "other settings"
      raise PrepareError(f"{out} holds an unfinished preparation of {what} ({diff}); prepare into another "
                         f"directory or delete {out}")
    if saved.get("chunk_sentences") != chunk_sentences:
      raise PrepareError(f"{out} holds an unfinished preparation of this corpus in chunks of "
                         f"{json.dumps(saved.get('chunk_sentences'))[:20]} sentences; rerun with --chunk_sentences="
                         f"{json.dumps(saved.get('chunk_sentences'))[:20]} to resume it, or delete {work}")
  elif os.path.isdir(out) and set(os.listdir(out)) - {PARTIAL}:  # a .partial without settings holds nothing
    raise PrepareError(f"{out} is not empty and holds no prepared corpus; prepare into another directory")
