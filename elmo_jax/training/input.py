"""The one place that builds the trainer's input from a config: sources (raw text, TFDS or a prepared
corpus), the vocabulary and the train/eval batch iterators (host numpy; `feed.py` puts them on devices).

A text corpus up to `config.data.auto_prepare_max_mb` is prepared once into `workdir/prepared/` (ids, type
table; `elmo_jax.data.prepare`) and trained from ids: same batches as the raw-text path, a fraction of the
host time. Larger corpora: run `elmo-jax prepare --num_workers=N` and set
`config.data.prepared_dir`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator

import jax
import ml_collections

from elmo_jax.runtime import files
from elmo_jax.runtime import log
from elmo_jax.runtime import storage
from elmo_jax.data import TextSource, TfdsSource, Tokenizer, Vocab, make_lm_iterator
from elmo_jax.data import manifest
from elmo_jax.data import prepare as prepare_lib
from elmo_jax.data.prepare_inputs import source_spec
from elmo_jax.data.sources import split_paths
from elmo_jax.data.prepared import PreparedCorpus, corpus_types, make_prepared_iterator
from elmo_jax.runtime.progress import progress
from elmo_jax.runtime.run_layout import PREPARED_DIR, VOCAB_FILE
from elmo_jax.training import derived
from elmo_jax.training.workdir import Workdir
from elmo_jax.data import lexicon as lexicon_lib


def make_sources(data: ml_collections.ConfigDict):
  """(train, eval) raw sentence sources from text files or a TFDS dataset; eval may be None."""
  if data.tfds_name:
    kw = dict(data_dir=data.tfds_data_dir or None, text_key=data.tfds_text_key, download=data.tfds_download)
    train = TfdsSource(data.tfds_name, data.tfds_train_split, **kw)
    evals = TfdsSource(data.tfds_name, data.tfds_eval_split, **kw) if data.tfds_eval_split else None
    return train, evals
  if not data.train_files:
    raise ValueError("config.data.train_files is empty and config.data.tfds_name is not set: no training data")
  train = TextSource(split_paths(data.train_files))
  evals = TextSource(split_paths(data.eval_files)) if data.eval_files else None
  return train, evals


def train_source(data: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """The text training files' identity (paths, sizes, mtimes: `prepare_inputs.source_spec`; and each file's
  sha256, `files.cached_sha256`: hashed once while its size, mtime and ctime stay; a bucket object: its URL,
  size and the crc32c the bucket keeps), recorded with every checkpoint so a resume notices a corpus edited
  in place, a same-size edit too; None for TFDS or a prepared corpus."""
  if data.prepared_dir or data.tfds_name or not data.train_files:
    return None
  found = []
  for item in split_paths(data.train_files):  # a bucket object by its URL (its local copy's path differs per host)
    found += ([storage.object_identity(item)] if storage.is_remote(item) else
              [{**f, "sha256": files.cached_sha256(f["path"])} for f in source_spec([item])["files"]])
  return {"kind": "text", "files": found}


def _auto_prepare(config, workdir: str | Workdir) -> tuple[str, str]:
  """(train, eval) prepared dirs under workdir/prepared for a small text corpus; ('', '') when not applicable.

  Process 0 prepares (a bucket workdir: into its local copy, then uploads it); the others wait, then read it
  (a bucket workdir: after copying it down)."""
  run = Workdir.of(workdir)
  data = config.data
  limit = float(data.auto_prepare_max_mb or 0)
  if data.tfds_name or not data.train_files or limit <= 0:
    return "", ""
  spec = source_spec(split_paths(data.train_files))
  size_mb = sum(f["size"] for f in spec["files"]) / 2**20
  if size_mb > limit:
    log.info(f"training text is {size_mb:,.0f} MB (> config.data.auto_prepare_max_mb={limit:g}): tokenizing on the "
             "fly; prepare it once with `elmo-jax prepare --num_workers=N` and set "
             "config.data.prepared_dir for full speed")
    return "", ""
  vocab = dict(vocab_file=data.vocab_file, vocab_max_size=data.vocab_max_size, vocab_min_count=data.vocab_min_count)
  kw = dict(pretokenized=data.pretokenized, max_token_chars=data.max_token_chars)
  # Keyed by what the output depends on, so a changed corpus or setting prepares anew instead of refusing.
  # The vocab file by content too: an edited vocabulary prepares anew (its path alone would be refused as an
  # unfinished preparation of other settings). A missing file is refused by prepare, in one line.
  with_sha = dict(vocab, vocab_sha256=files.sha256_file(data.vocab_file)) if (
      data.vocab_file and os.path.isfile(data.vocab_file)) else vocab
  key = json.dumps([spec, data.eval_files, with_sha, kw], sort_keys=True)
  root = os.path.join(run.local, PREPARED_DIR, hashlib.sha256(key.encode()).hexdigest()[:12])
  train_dir = os.path.join(root, "train")
  eval_dir = os.path.join(root, "eval") if data.eval_files else ""
  if jax.process_index() == 0:  # the others wait at the barrier, then read what process 0 wrote
    if not os.path.exists(os.path.join(train_dir, manifest.MANIFEST)):
      where = (f"{storage.join(run.path, os.path.relpath(root, run.local))} (written in {root}, then uploaded)"
               if run.remote else root)
      log.info(f"preparing the training text ({size_mb:,.1f} MB) into {where} once; later runs read its ids")
    prepare_lib.prepare(train_dir, split_paths(data.train_files), chunk_sentences=50_000, log_line=log.info, **vocab,
                        **kw)
    if eval_dir:
      prepare_lib.prepare(eval_dir, split_paths(data.eval_files), vocab_max_size=None, log_line=log.info, **kw)
    run.push(PREPARED_DIR)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("auto_prepare")
    if jax.process_index() != 0:
      run.pull(PREPARED_DIR)
  return train_dir, eval_dir


@dataclasses.dataclass
class TrainInput:
  """What the loop needs from the data: the vocab and ways to make train/eval batch iterators."""
  vocab: Vocab
  train: Callable[..., Iterator[dict[str, Any]]]  # (dedupe_shards) -> the training iterator
  eval: Callable[..., Iterator[dict[str, Any]]] | None  # (dedupe_shards, **shard) -> one pass over eval
  description: str
  eval_sentences: int = 0  # sentences in the eval split (for the progress bar)


def _report_skipped(name: str, source) -> None:
  skipped = {k: v for k, v in getattr(source, "skipped", {}).items() if v}
  if skipped:  # bad lines never stop a run, but the user should know they were dropped
    first = getattr(source, "first_skipped", {})
    log.info(f"{name} data: skipped " + ", ".join(
             f"{n:,} {reason} lines" + (f" (first at {first[reason]})" if reason in first else "")
             for reason, n in skipped.items()))


def _run_vocab(config, run: Workdir, build: Callable[[], Vocab]) -> Vocab:
  """The workdir's vocab when a checkpoint holds the run (a resume), else config.data.vocab_file, else
  `build()`; saved into the workdir (its local copy: the caller uploads it).

  Without a checkpoint (a start killed before its first save, or whose checkpoints were all set aside) a saved
  vocab.txt is only what the earlier start built: it is built again, so a training text edited in between (a
  same-size edit included) is not trained with the old text's vocabulary.
  """
  saved = os.path.join(run.local, VOCAB_FILE)
  if derived.kept(run.local, VOCAB_FILE, run.checkpoints):  # the one rule of what a start derives
    return Vocab.load(saved)
  vocab = Vocab.load(config.data.vocab_file) if config.data.vocab_file else build()
  if os.path.exists(saved):
    try:
      same = Vocab.load(saved).sha256() == vocab.sha256()
    except (OSError, ValueError):
      same = False
    if not same:
      log.info(f"{saved}: the earlier start's vocabulary is not this one (the training data or its settings "
               "changed since) and no checkpoint was trained with it: replaced")
  if jax.process_index() == 0:
    vocab.save(run.local)
  return vocab


def _token_ids(config, run: Workdir):
  """An EFML-style run's `lexicon.TokenIds` (its lexicons saved into the workdir by process 0), else None."""
  from elmo_jax.training import variant  # pylint: disable=g-import-not-at-top
  lex = variant.lexicon(config, run.local, checkpoints=run.checkpoints)
  if lex is None:
    return None
  if jax.process_index() == 0:
    variant.save_lexicon(lex, run.local, run.checkpoints)
  return lambda: lexicon_lib.TokenIds(lex)


def _report_unknown(name: str, corpus: PreparedCorpus, token_ids) -> None:
  """One line: the tokens of a prepared split that EFML's lexicons map to `<oov>` (a word, or a char)."""
  counts = corpus.type_counts()
  limit = corpus.settings["max_token_chars"]
  flags = [token_ids.is_unknown(t[:limit]) for t in corpus.types[3:]]  # past <S>, </S>, <UNK>
  if counts is None or not flags:
    return
  import numpy as np  # pylint: disable=g-import-not-at-top
  words, chars_ = (np.asarray([f[i] for f in flags], bool) for i in (0, 1))
  n = int(counts[3:].sum())
  log.info(f"{name} data through the EFML lexicons: {int(counts[3:][words].sum()):,} of {n:,} tokens "
           f"({int(words.sum()):,} types) have no word.dic entry (<oov>); {int(counts[3:][chars_].sum()):,} tokens "
           f"({int(chars_.sum()):,} types) hold a char outside char.dic (<oov>)")


def make_input(config, workdir: str | Workdir, local_rows: int) -> TrainInput:
  """Opens the run's data: a prepared corpus (config.data.prepared_dir or auto-prepared) or raw sources."""
  run = Workdir.of(workdir)
  new_ids = _token_ids(config, run)
  workdir = run.local
  data = config.data
  train_dir = data.prepared_dir
  eval_dir = data.prepared_eval_dir
  if not train_dir:
    train_dir, eval_dir = _auto_prepare(config, run)
  common = dict(batch_size=local_rows, unroll_steps=config.unroll_steps, seed=config.seed)
  # Eval tables go by content: the perplexities keep the bits they had before batches were deduped by type
  # id (a table's row order can move the char CNN's output by ~1e-7 on XLA:CPU).
  once = dict(shuffle=False, num_epochs=1, dedupe_by="content", **common)
  shard = data.shard
  if train_dir:
    corpus = PreparedCorpus(train_dir)
    eval_corpus = PreparedCorpus(eval_dir) if eval_dir else None
    _report_skipped("train", corpus)
    vocab = _run_vocab(config, run, corpus.vocab)
    ids = new_ids() if new_ids else None
    types = corpus_types(corpus, vocab, ids)
    eval_types = None if eval_corpus is None else corpus_types(eval_corpus, vocab, ids)
    if ids is not None and jax.process_index() == 0:
      for name, split in (("train", corpus), ("eval", eval_corpus)):
        if split is not None:
          _report_unknown(name, split, ids)

    def train(dedupe_shards=None):
      return make_prepared_iterator(corpus, vocab, shard=shard, types=types, dedupe_shards=dedupe_shards, **common)

    def evals(**kw):
      return make_prepared_iterator(eval_corpus, vocab, types=eval_types, **once, **kw)

    return TrainInput(vocab, train, None if eval_corpus is None else evals, f"prepared corpus {train_dir}",
                      len(eval_corpus) if eval_corpus is not None else 0)

  tokenizer = Tokenizer(pretokenized=data.pretokenized)
  train_source, eval_source = make_sources(data)
  _report_skipped("train", train_source)
  _report_skipped("eval", eval_source)

  def build() -> Vocab:
    started = time.time()
    lines = progress(range(len(train_source)), desc="building vocabulary", unit="line",
                     disable=jax.process_index() != 0)
    vocab = Vocab.build((tokenizer(train_source[i]) for i in lines),
                        max_size=data.vocab_max_size, min_count=data.vocab_min_count)
    log.info(f"built vocabulary of {len(vocab):,} tokens from {len(train_source):,} training lines "
             f"in {time.time() - started:.1f}s")
    return vocab

  vocab = _run_vocab(config, run, build)
  raw = dict(max_token_chars=data.max_token_chars, **common)
  # raw text: unknown words and chars are counted per token type as the text is read (`lexicon.TokenIds`)

  def train_raw(dedupe_shards=None):
    return make_lm_iterator(train_source, vocab, tokenizer, shard=shard, dedupe_shards=dedupe_shards,
                            token_ids=new_ids() if new_ids else None, **raw)

  def evals_raw(**kw):
    return make_lm_iterator(eval_source, vocab, tokenizer, max_token_chars=data.max_token_chars, **once,
                            token_ids=new_ids() if new_ids else None, **kw)

  return TrainInput(vocab, train_raw, None if eval_source is None else evals_raw, f"raw text {train_source!r}",
                    len(eval_source) if eval_source is not None else 0)
