"""Beam's RunInference with `ElmoModelHandler`, on Beam's in-process runner named explicitly (`FnApiRunner`: the
default local runner fetches a binary): every element once, its output equal to the Embedder's within rounding
(Beam's batches are not the reference's), the batch kept within the warm shapes. Runs where the beam extra is
installed (scripts/test_beam.sh: Beam pins older pyarrow and protobuf than the locks)."""
from __future__ import annotations

import glob
import gzip
import os
import pickle

import numpy as np
import pytest

from elmo_jax.embedding.embedder import Embedder
from cluster_page import page_python_blocks
from paths import FIXTURE_DIR, REPO_ROOT

beam = pytest.importorskip("apache_beam")
from apache_beam.ml.inference.base import RunInference  # pylint: disable=g-import-not-at-top,wrong-import-position
from apache_beam.runners.portability.fn_api_runner import FnApiRunner  # pylint: disable=g-import-not-at-top

from elmo_jax.engines.beam import ElmoModelHandler  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="module")
def lines():
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "valid.txt.gz"), "rt", encoding="utf-8") as f:
    return [next(f).strip() for _ in range(120)]


def _run(handler: ElmoModelHandler, elements, out: str) -> dict:
  with beam.Pipeline(runner=FnApiRunner()) as p:
    _ = (p | beam.Create(elements) | RunInference(handler)
         | beam.Map(lambda r: pickle.dumps((r.example, r.inference)).hex()) | beam.io.WriteToText(out))
  pairs = [pickle.loads(bytes.fromhex(line.strip())) for path in glob.glob(out + "*") for line in open(path)]
  return {(tuple(k) if isinstance(k, list) else k): v for k, v in pairs}


def test_run_inference_equals_the_embedder(lines, tmp_path):
  got = _run(ElmoModelHandler(FIXTURE_DIR, output="top"), lines, str(tmp_path / "top"))
  embedder = Embedder.from_pretrained(FIXTURE_DIR, warm=False)
  want = embedder.embed_sentences([line.split() for line in lines])
  assert sorted(got) == sorted(set(lines))  # every element once
  for line, layers in zip(lines, want):
    np.testing.assert_allclose(got[line], layers[-1], atol=1e-5)


def test_sentence_vectors_of_token_lists_in_float16(lines, tmp_path):
  elements = [line.split() for line in lines[:40]]
  got = _run(ElmoModelHandler(FIXTURE_DIR, output="average", sentence_vectors=True, dtype="float16"),
             elements, str(tmp_path / "vectors"))
  embedder = Embedder.from_pretrained(FIXTURE_DIR, warm=False)
  want = embedder.sentence_vectors(elements, "average")
  for sentence, vector in zip(elements, want):
    assert got[tuple(sentence)].dtype == np.float16
    np.testing.assert_allclose(got[tuple(sentence)].astype(np.float32), vector, atol=2e-3)


def test_batches_stay_within_the_warm_shapes_and_choices_are_checked():
  handler = ElmoModelHandler(FIXTURE_DIR)
  assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 64}
  assert not handler.share_model_across_processes()
  assert ElmoModelHandler(FIXTURE_DIR, large_model=True).share_model_across_processes()
  with pytest.raises(ValueError, match="output must be one of"):
    ElmoModelHandler(FIXTURE_DIR, output="elmo")


def test_the_pages_beam_block_runs(lines, tmp_path, monkeypatch):
  (tmp_path / "corpus").mkdir()
  with gzip.open(tmp_path / "corpus" / "a.txt.gz", "wt", encoding="utf-8") as f:
    f.write("\n".join(lines[:30]) + "\n")
  monkeypatch.chdir(tmp_path)
  blocks = page_python_blocks("apache_beam")
  assert len(blocks) == 1 and "beam.Pipeline()" in blocks[0]
  code = "from apache_beam.runners.portability.fn_api_runner import FnApiRunner\n" + blocks[0].replace(
      "beam.Pipeline()", "beam.Pipeline(runner=FnApiRunner())")  # the default runner fetches a binary
  exec(compile(code, "docs/cluster.md", "exec"), {})  # pylint: disable=exec-used
  written = [line for path in glob.glob("vectors*") for line in open(path, encoding="utf-8")]
  assert sorted(line.split("\t")[0] for line in written) == sorted(lines[:30])
