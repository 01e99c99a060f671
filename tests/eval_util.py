"""Shared helpers of the evaluation tests: a fake embedder and small probe files."""
from __future__ import annotations

import hashlib

import numpy as np

from elmo_jax.evaluation import probes, tasks

FAST = probes.ProbeConfig(max_epochs=25, patience=4)


class FakeEmbedder:
  """Deterministic stand-in for elmo_jax.embedding.embedder.Embedder (3 layers, dim 16).

  layer 0: a fixed random vector per word type (context-free, like the char CNN);
  layer 1: the type vector plus the sum of the other tokens' vectors (context);
  layer 2: noise that depends on the token's position only.
  """
  n_layers = 3
  dim = 16

  def __init__(self, seed: int = 0):
    self.seed = seed
    self.options = {"lstm": {"n_layers": 2}, "fake_seed": seed}
    self.calls = 0

  def _vec(self, word: str) -> np.ndarray:
    digest = hashlib.sha256(f"{self.seed}|{word}".encode()).digest()
    rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return rng.normal(size=self.dim).astype(np.float32)

  def embed_sentences(self, sentences, batch_size=64):
    self.calls += 1
    out = []
    for s in sentences:
      types = np.stack([self._vec(w) for w in s])
      context = types.sum(0, keepdims=True) - types
      noise = np.stack([self._vec(f"<pos{i}>") for i in range(len(s))])
      out.append(np.stack([types, types + context, noise]).astype(np.float32))
    return out

  def untrained_twin(self, seed: int = 0):
    return FakeEmbedder(seed=1000 + seed)


def fake_models(counter: list | None = None):
  def load():
    if counter is not None:
      counter.append(1)
    emb = FakeEmbedder()
    return tasks.Models(emb, emb.untrained_twin(), "fake", "fake-twin", {"fake": True})
  return load


def write(path, text: str) -> str:
  path.write_text(text, encoding="utf-8")
  return str(path)


def wsd_tsv() -> str:
  rows = []
  for i, ctx in enumerate(["river water", "water river", "river flows water"]):
    rows.append(f"bank\tnoun\tbank%river\t0\tbank {ctx}")
  for ctx in ["money cash", "cash money", "money loan cash"]:
    rows.append(f"bank\tnoun\tbank%money\t0\tbank {ctx}")
  rows.append("solo\tnoun\tsolo%1\t0\tsolo only one sense")  # 1 sense: not eligible
  return "\n".join(rows) + "\n"


def pos_conll(rng: np.random.Generator, n: int) -> str:
  nouns, verbs, dets = ["cat", "dog", "bird", "fish"], ["runs", "eats", "sees"], ["the", "a"]
  lines = []
  for _ in range(n):
    lines += [f"{rng.choice(dets)}\tDT", f"{rng.choice(nouns)}\tNN",
              f"{rng.choice(verbs)}\tVBZ", ""]
  return "\n".join(lines) + "\n"


def sentiment_tsv(rng: np.random.Generator, n: int) -> str:
  filler = ["movie", "plot", "actor", "story", "film", "scene"]
  lines = []
  for _ in range(n):
    label = int(rng.integers(2))
    cue = rng.choice(["good", "great", "fine"] if label else ["bad", "awful", "dull"])
    words = list(rng.choice(filler, size=3)) + [cue]
    rng.shuffle(words)
    lines.append(f"{label}\t{' '.join(words)}.")
  return "\n".join(lines) + "\n"


def eval_cfg(tmp_path, **kw) -> tasks.EvalConfig:
  rng = np.random.default_rng(1)
  return tasks.EvalConfig(
      output_dir=str(tmp_path / "out"),
      wsd_file=write(tmp_path / "w.tsv", wsd_tsv()),
      pos_train_file=write(tmp_path / "tr.conll", pos_conll(rng, 150)),
      pos_test_file=write(tmp_path / "te.conll", pos_conll(rng, 40)),
      sentiment_train_file=write(tmp_path / "tr.tsv", sentiment_tsv(rng, 300)),
      sentiment_test_file=write(tmp_path / "te.tsv", sentiment_tsv(rng, 100)),
      probe=FAST, **kw)
