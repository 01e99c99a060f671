"""Matplotlib (Agg) plots for the probes and for training curves.

Every function writes a PNG atomically (temp file in the same directory, then
rename) and returns its path.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # Headless: no display on training/eval machines.
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from elmo_jax import files  # noqa: E402


def _save(fig, path: str) -> str:
  try:
    with files.atomic_path(path, suffix=".png") as tmp:
      fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
  finally:
    plt.close(fig)
  return path


def score_keys(scores: dict[str, Any]) -> list[str]:
  """`layer_0`, `layer_1`, ... in order, then `mix` when it has a value."""
  layers = sorted((k for k in scores if k.startswith("layer_") and k[6:].isdigit()),
                  key=lambda k: int(k[6:]))
  return layers + (["mix"] if scores.get("mix") is not None else [])


def plot_layer_scores(result: dict[str, Any], path: str, title: str) -> str:
  """Bars of accuracy per layer (and mix), trained vs untrained model."""
  keys = score_keys(result["trained"])
  x = np.arange(len(keys))
  fig, ax = plt.subplots(figsize=(1.4 * len(keys) + 2, 3.5))
  for offset, model, colour in ((-0.2, "trained", "tab:blue"),
                                (0.2, "untrained", "tab:grey")):
    if model not in result:
      continue
    vals = [result[model].get(k) for k in keys]
    vals = [np.nan if v is None else v for v in vals]
    bars = ax.bar(x + offset, vals, width=0.4, label=model, color=colour)
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
  ax.set_xticks(x, keys)
  ax.set_ylim(0, 1.05)
  ax.set_ylabel("accuracy")
  ax.set_title(title)
  ax.legend(loc="lower right", fontsize=8)
  return _save(fig, path)


def plot_mix_weights(result: dict[str, Any], path: str, title: str) -> str:
  """Bars of the learned softmax-normalised layer weights, trained vs untrained."""
  n = len(result["trained"]["mix_weights"])
  x = np.arange(n)
  fig, ax = plt.subplots(figsize=(1.2 * n + 2, 3.2))
  for offset, model, colour in ((-0.2, "trained", "tab:blue"),
                                (0.2, "untrained", "tab:grey")):
    weights = result.get(model, {}).get("mix_weights")
    if weights:
      bars = ax.bar(x + offset, weights, width=0.4, label=model, color=colour)
      ax.bar_label(bars, fmt="%.2f", fontsize=7)
  ax.set_xticks(x, [f"layer_{i}" for i in range(n)])
  ax.set_ylim(0, 1.05)
  ax.set_ylabel("mix weight (softmax)")
  ax.set_title(title)
  ax.legend(fontsize=8)
  return _save(fig, path)


def plot_wsd_pca(label: str, senses: Sequence[str], coords: np.ndarray,
                 path: str) -> str:
  """One panel per layer: 2-D PCA of a lemma's occurrences coloured by sense.

  Args:
    coords: (L, K, 2) coordinates, K occurrences.
  """
  n_layers = coords.shape[0]
  names = sorted(set(senses))
  cmap = plt.get_cmap("tab10")
  fig, axes = plt.subplots(1, n_layers, figsize=(3.2 * n_layers, 3.2), squeeze=False)
  for layer, ax in enumerate(axes[0]):
    for s_i, name in enumerate(names):
      pts = coords[layer, [i for i, s in enumerate(senses) if s == name]]
      ax.scatter(pts[:, 0], pts[:, 1], s=18, color=cmap(s_i % 10), label=name,
                 alpha=0.8)
    ax.set_title(f"layer_{layer}")
    ax.set_xticks([])
    ax.set_yticks([])
  axes[0][-1].legend(fontsize=6, loc="best")
  fig.suptitle(f"WSD: occurrences of '{label}' by sense (PCA)", y=1.04)
  return _save(fig, path)


def read_metrics(path: str) -> list[dict[str, Any]]:
  """Parses a metrics.jsonl file; errors name the line."""
  rows = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{number}: expected a JSON object")
      rows.append(row)
  return rows


def plot_perplexity(metrics_path: str, path: str) -> str:
  """Train and eval perplexity (forward, backward, mean) against step, log scale.

  Eval lines carry `eval_ppl_forward/backward/eval_ppl`; train lines carry
  `train_ppl_forward/backward`. Lines without a `step` are ignored.
  """
  rows = [r for r in read_metrics(metrics_path) if "step" in r]
  series = {
      "train forward": ("train_ppl_forward", "tab:blue", ":"),
      "train backward": ("train_ppl_backward", "tab:orange", ":"),
      "eval forward": ("eval_ppl_forward", "tab:blue", "-"),
      "eval backward": ("eval_ppl_backward", "tab:orange", "-"),
      "eval mean": ("eval_ppl", "black", "-"),
  }
  fig, ax = plt.subplots(figsize=(6, 3.8))
  plotted = 0
  for name, (key, colour, style) in series.items():
    pts = [(r["step"], r[key]) for r in rows
           if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
    if pts:
      steps, vals = zip(*pts)
      ax.plot(steps, vals, style, color=colour, label=name,
              marker="o" if key.startswith("eval") and len(pts) < 30 else None,
              markersize=3)
      plotted += 1
  if not plotted:
    plt.close(fig)
    raise ValueError(f"{metrics_path}: no perplexity values to plot")
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("perplexity")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  return _save(fig, path)
