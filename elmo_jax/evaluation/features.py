"""Feature extraction from an embedder, with an on-disk cache of all layers.

A cache entry holds every representation layer of one dataset under one model,
so new probes (or a new scalar mix) can be trained without re-running the LM.
The key hashes the model identity, the dataset file contents, the feature kind
and the example selection; a changed weight file or dataset gives a new entry.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from elmo_jax.evaluation import readers
from elmo_jax.runtime import files
from elmo_jax.runtime.progress import progress
from elmo_jax.runtime.run_layout import EXPORT_DIR


class EmbedderLike(Protocol):
  """What the probes need from `elmo_jax.embedding.embedder.Embedder`."""
  n_layers: int
  options: dict

  def embed_sentences(self, sentences: list[list[str]],
                      batch_size: int = 64) -> list[np.ndarray]:
    ...


def model_key_from_files(options_file: str, weight_file: str) -> str:
  """Identity of a model on disk: options content + weight file path/size/mtime.

  Hashing a multi-GB weight file on every run would be slow, so its identity is
  (real path, size, mtime); a rewritten file changes at least the mtime.
  """
  digest = hashlib.sha256()
  digest.update(files.sha256_file(options_file).encode())
  st = os.stat(weight_file)
  digest.update(f"{os.path.realpath(weight_file)}|{st.st_size}|{st.st_mtime_ns}".encode())
  return digest.hexdigest()[:16]


def model_key_from_paths(paths: Sequence[str]) -> str:
  """Identity of a model read from these files (any format): each one's real path, size and mtime."""
  digest = hashlib.sha256()
  for path in sorted(paths):
    st = os.stat(path)
    digest.update(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
  return digest.hexdigest()[:16]


def model_key_from_workdir(workdir: str) -> str:
  """Identity of a trained run: every file under workdir/export (path/size/mtime)."""
  export = os.path.join(workdir, EXPORT_DIR)
  if not os.path.isdir(export):
    raise readers.InputError(f"{export}: no exported model (directory not found)")
  digest = hashlib.sha256()
  for root, _, names in sorted(os.walk(export)):
    for name in sorted(names):
      path = os.path.join(root, name)
      st = os.stat(path)
      digest.update(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
  return digest.hexdigest()[:16]


def dataset_key(paths: Sequence[str], **selection: Any) -> str:
  """Hash of the dataset files' contents plus how examples were selected."""
  digest = hashlib.sha256()
  for path in paths:
    digest.update(files.sha256_file(path).encode())
  digest.update(json.dumps(selection, sort_keys=True, default=str).encode())
  return digest.hexdigest()[:16]


def cached(cache_dir: str | None, name: str, compute: Callable[[], np.ndarray]
           ) -> np.ndarray:
  """Returns `compute()`, memoised as `cache_dir/name.npz` (atomic write)."""
  if not cache_dir:
    return compute()
  path = os.path.join(cache_dir, name + ".npz")
  if os.path.exists(path):
    try:
      with np.load(path) as data:
        return data["features"]
    except (OSError, ValueError, KeyError):
      pass  # A corrupt entry (e.g. a killed run on a non-atomic fs): recompute.
  features = compute()
  with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
    np.savez(f, features=features)
  return features


def _embed(embedder: EmbedderLike, sentences: Sequence[Sequence[str]],
           batch_size: int) -> list[np.ndarray]:
  """Embeds sentences; checks the (n_layers, n_tokens, dim) contract.

  In chunks of many batches, under a progress bar: each chunk is still length-sorted by the embedder,
  and a stateless embedding does not depend on how sentences are grouped.
  """
  chunk = max(16 * batch_size, 1024)
  bar = progress(desc="features", total=len(sentences), unit="sent")
  out: list[np.ndarray] = []
  for start in range(0, len(sentences), chunk):
    part = [list(s) for s in sentences[start:start + chunk]]
    out.extend(embedder.embed_sentences(part, batch_size=batch_size))
    bar.update(len(part))
  bar.close()
  if len(out) != len(sentences):
    raise RuntimeError(f"embedder returned {len(out)} results for {len(sentences)} sentences")
  for s, e in zip(sentences, out):
    if e.ndim != 3 or e.shape[0] != embedder.n_layers or e.shape[1] != len(s):
      raise RuntimeError(f"embedder returned shape {e.shape} for a sentence of "
                         f"{len(s)} tokens; expected ({embedder.n_layers}, {len(s)}, dim)")
  return out


def token_features(embedder: EmbedderLike, sentences: Sequence[Sequence[str]],
                   batch_size: int = 64) -> np.ndarray:
  """All tokens of all sentences, concatenated.

  Returns:
    float32 (n_tokens_total, n_layers, dim), tokens in sentence order.
  """
  out = _embed(embedder, sentences, batch_size)
  return np.concatenate([np.transpose(e, (1, 0, 2)) for e in out]).astype(np.float32)


def mean_features(embedder: EmbedderLike, sentences: Sequence[Sequence[str]],
                  batch_size: int = 64) -> np.ndarray:
  """Mean over tokens of each sentence.

  Returns:
    float32 (n_sentences, n_layers, dim).
  """
  out = _embed(embedder, sentences, batch_size)
  return np.stack([e.mean(axis=1) for e in out]).astype(np.float32)


def target_features(embedder: EmbedderLike, sentences: Sequence[Sequence[str]],
                    indices: Sequence[int], batch_size: int = 64) -> np.ndarray:
  """The vector of one target token per sentence.

  Returns:
    float32 (n_sentences, n_layers, dim).
  """
  out = _embed(embedder, sentences, batch_size)
  return np.stack([e[:, i] for e, i in zip(out, indices)]).astype(np.float32)
