"""Word-sense nearest-neighbour probes (leave-one-out 1-NN and sense centroids).

Tie rule: an occurrence is *tied* when the neighbours whose cosine similarity
is within `TIE_TOLERANCE` of its best similarity carry more than one sense. A
tied occurrence cannot be separated by the representation (e.g. layer 0 of
ELMo gives one vector per word type), so it scores 0 in `layer_k` and is
counted in `layer_k_ties`; `layer_k_excluding_ties` scores untied ones only.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np

from elmo_jax.evaluation.readers import WsdExample

TIE_TOLERANCE = 1e-5
TIE_RULE = (
    "Occurrences are grouped by (lemma, pos). For each occurrence the neighbours "
    f"within {TIE_TOLERANCE} of its best cosine similarity are taken; if they "
    "carry more than one sense the occurrence is a tie (scored as wrong in "
    "layer_k, counted in layer_k_ties, left out of layer_k_excluding_ties), "
    "otherwise it is correct when that sense equals its own. Only groups with "
    ">= 2 senses and >= 2 occurrences count.")


def _unit(x: np.ndarray) -> np.ndarray:
  """Rows scaled to unit L2 norm (zero rows stay zero). x: (N, D)."""
  norm = np.linalg.norm(x, axis=-1, keepdims=True)
  return x / np.maximum(norm, 1e-12)


def eligible_groups(examples: Sequence[WsdExample]) -> dict[tuple[str, str], list[int]]:
  """(lemma, pos) -> row indices, for groups with >= 2 senses and >= 2 rows."""
  groups: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
  for i, ex in enumerate(examples):
    groups[(ex.lemma, ex.pos)].append(i)
  return {k: v for k, v in sorted(groups.items())
          if len(v) >= 2 and len({examples[i].sense for i in v}) >= 2}


def _judge(sims: np.ndarray, cand_senses: Sequence[str], own: str) -> str:
  """'correct' / 'wrong' / 'tie' for one query; sims: (K,) over candidates."""
  best = sims.max()
  near = {cand_senses[j] for j in np.flatnonzero(sims >= best - TIE_TOLERANCE)}
  if len(near) > 1:
    return "tie"
  return "correct" if own in near else "wrong"


def _summarise(outcomes: list[list[str]]) -> dict[str, Any]:
  """outcomes[layer] = per-occurrence verdicts -> the JSON scores."""
  out: dict[str, Any] = {}
  for layer, verdicts in enumerate(outcomes):
    n = len(verdicts)
    correct = verdicts.count("correct")
    ties = verdicts.count("tie")
    out[f"layer_{layer}"] = correct / n if n else None
    out[f"layer_{layer}_ties"] = ties / n if n else None
    out[f"layer_{layer}_excluding_ties"] = correct / (n - ties) if n > ties else None
  out["n"] = len(outcomes[0]) if outcomes else 0
  out["mix"] = None         # Nearest neighbour has nothing to learn a mix with.
  out["mix_weights"] = None
  return out


def nearest_neighbour(examples: Sequence[WsdExample], features: np.ndarray
                      ) -> dict[str, Any]:
  """Leave-one-out 1-NN sense accuracy per layer.

  Args:
    examples: the rows; features[i] belongs to examples[i].
    features: float (N, L, D) target-token vectors.

  Returns:
    {"layer_k": acc, "layer_k_ties": share, "layer_k_excluding_ties": acc,
     "layer_k_answerable": correct / n_answerable, "n": occurrences scored,
     "n_groups": groups, "n_answerable": rows whose sense has another example in the group,
     "mix": None, "mix_weights": None}.
  """
  groups = eligible_groups(examples)
  n_layers = features.shape[1]
  outcomes: list[list[str]] = [[] for _ in range(n_layers)]
  for rows in groups.values():
    senses = [examples[i].sense for i in rows]
    for layer in range(n_layers):
      v = _unit(features[rows, layer].astype(np.float64))
      sims = v @ v.T
      for q in range(len(rows)):
        others = [j for j in range(len(rows)) if j != q]
        outcomes[layer].append(_judge(sims[q, others], [senses[j] for j in others],
                                      senses[q]))
  out = _summarise(outcomes)
  out["n_groups"] = len(groups)
  # Occurrences whose sense occurs again in the group: the only ones a perfect
  # representation could get right (many WordNet senses have one example), so
  # layer_k_answerable = correct / n_answerable is the score on a 0-1 scale.
  n_answerable = sum(
      sum(1 for i in rows if sum(examples[j].sense == examples[i].sense for j in rows) > 1)
      for rows in groups.values())
  out["n_answerable"] = n_answerable
  for layer, verdicts in enumerate(outcomes):
    out[f"layer_{layer}_answerable"] = (verdicts.count("correct") / n_answerable
                                        if n_answerable else None)
  return out


def sense_centroids(train: Sequence[WsdExample], train_features: np.ndarray,
                    test: Sequence[WsdExample], test_features: np.ndarray
                    ) -> dict[str, Any]:
  """The paper's protocol: per-sense mean vectors from train, 1-NN on test.

  Test rows whose (lemma, pos) has fewer than 2 senses in train are not scored
  (reported as `n_skipped`), since there is nothing to choose between.

  Args:
    train_features: (N, L, D); test_features: (M, L, D).
  """
  n_layers = train_features.shape[1]
  by_group: dict[tuple[str, str], dict[str, list[int]]] = collections.defaultdict(
      lambda: collections.defaultdict(list))
  for i, ex in enumerate(train):
    by_group[(ex.lemma, ex.pos)][ex.sense].append(i)
  outcomes: list[list[str]] = [[] for _ in range(n_layers)]
  skipped = 0
  for j, ex in enumerate(test):
    senses = by_group.get((ex.lemma, ex.pos), {})
    if len(senses) < 2:
      skipped += 1
      continue
    names = sorted(senses)
    for layer in range(n_layers):
      cents = _unit(np.stack([train_features[senses[s], layer].astype(np.float64).mean(0)
                              for s in names]))
      q = _unit(test_features[j, layer].astype(np.float64)[None])[0]
      outcomes[layer].append(_judge(cents @ q, names, ex.sense))
  out = _summarise(outcomes)
  out["n_skipped"] = skipped
  return out


def pca_example(examples: Sequence[WsdExample], features: np.ndarray,
                lemma: str | None = None) -> tuple[str, list[str], np.ndarray]:
  """Picks an ambiguous (lemma, pos) and projects its occurrences to 2-D per layer.

  By default the eligible group with the most occurrences (ties: most senses,
  then alphabetical) is used.

  Returns:
    (label "lemma/pos", senses per occurrence, float (L, K, 2) PCA coordinates).
  """
  groups = eligible_groups(examples)
  if not groups:
    raise ValueError("no ambiguous lemma with >= 2 senses and >= 2 occurrences")
  if lemma is not None:
    keys = [k for k in groups if k[0] == lemma]
    if not keys:
      raise ValueError(f"lemma {lemma!r} is not ambiguous in the data")
    key = keys[0]
  else:
    key = min(groups, key=lambda k: (-len(groups[k]),
                                     -len({examples[i].sense for i in groups[k]}), k))
  rows = groups[key]
  coords = []
  for layer in range(features.shape[1]):
    x = features[rows, layer].astype(np.float64)
    x = x - x.mean(0)
    # SVD-based PCA; a constant layer (all rows equal) projects to the origin.
    u, s, _ = np.linalg.svd(x, full_matrices=False)
    c = u[:, :2] * s[:2]
    if c.shape[1] < 2:
      c = np.pad(c, ((0, 0), (0, 2 - c.shape[1])))
    coords.append(c)
  return f"{key[0]}/{key[1]}", [examples[i].sense for i in rows], np.stack(coords)
