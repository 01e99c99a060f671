"""Shared helpers of the embedding tests: bilm-tf's fixture model and sentences, input files, interruptions, and
output files compared."""
from __future__ import annotations

import json
import os

import h5py
import numpy as np

from elmo_jax.embedding.embedder import Embedder
from paths import FIXTURE_DIR, FIXTURE_OPTIONS, FIXTURE_WEIGHTS


with open(os.path.join(FIXTURE_DIR, "lm_embeddings_sentences.json")) as _f:
  SENTENCES: list[list[str]] = json.load(_f)


def model_args() -> list[str]:
  return [f"--options_file={FIXTURE_OPTIONS}", f"--weight_file={FIXTURE_WEIGHTS}"]


def write_lines(path, lines: list[str]) -> str:
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return str(path)


def error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def stop_at_launch(monkeypatch, embedder: Embedder, k: int) -> None:
  """The embedder's k-th batch launch raises KeyboardInterrupt (an interrupted job); undo: monkeypatch."""
  real, launched = embedder._launch, []  # pylint: disable=protected-access

  def stopping(prepared):
    launched.append(1)
    if len(launched) == k:
      raise KeyboardInterrupt
    return real(prepared)

  monkeypatch.setattr(embedder, "_launch", stopping)


def contents(path) -> dict:
  """Every dataset of an HDF5 file by path (sentence_to_index decoded)."""
  out = {}
  with h5py.File(path, "r") as f:
    f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
  if "sentence_to_index" in out:
    out["sentence_to_index"] = json.loads(out["sentence_to_index"][0])
  return out


def assert_same_contents(a, b) -> None:
  assert sorted(a) == sorted(b)
  for key in a:
    if key == "sentence_to_index":
      assert a[key] == b[key]
    else:
      assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
