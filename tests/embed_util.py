"""Shared helpers of the embedding tests: bilm-tf's fixture model and sentences, input files, interruptions."""
from __future__ import annotations

import json
import os

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
