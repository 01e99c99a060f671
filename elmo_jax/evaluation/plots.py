"""Matplotlib plots for the probes, WSD and training curves.

Every plot function draws on `ax` when given (a notebook's own axes) and otherwise on a new
`matplotlib.figure.Figure`; it returns the figure. Nothing here touches pyplot or the backend, so importing
this module changes no global matplotlib state. `save(fig, path)` writes a PNG atomically.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from elmo_jax.runtime import files

_MODEL_COLOURS = {"trained": "tab:blue", "untrained": "tab:grey"}


def _figure(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
  if ax is not None:
    return ax.figure, ax
  fig = Figure(figsize=figsize)
  return fig, fig.subplots()


def save(fig: Figure, path: str) -> str:
  """Writes `fig` as a PNG atomically (temp file beside `path`, then rename); returns `path`."""
  with files.atomic_path(path, suffix=".png") as tmp:
    fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
  return path


def score_keys(scores: dict[str, Any]) -> list[str]:
  """`layer_0`, `layer_1`, ... in order, then `mix` when it has a value."""
  layers = sorted((k for k in scores if k.startswith("layer_") and k[6:].isdigit()),
                  key=lambda k: int(k[6:]))
  return layers + (["mix"] if scores.get("mix") is not None else [])


def layer_scores(result: dict[str, Any], title: str, ax: Axes | None = None) -> Figure:
  """Bars of accuracy per layer (and mix), trained vs untrained model."""
  keys = score_keys(result["trained"])
  x = np.arange(len(keys))
  fig, ax = _figure(ax, (1.4 * len(keys) + 2, 3.5))
  for offset, model in ((-0.2, "trained"), (0.2, "untrained")):
    if model not in result:
      continue
    vals = [result[model].get(k) for k in keys]
    vals = [np.nan if v is None else v for v in vals]
    bars = ax.bar(x + offset, vals, width=0.4, label=model, color=_MODEL_COLOURS[model])
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
  ax.set_xticks(x, keys)
  ax.set_ylim(0, 1.05)
  ax.set_ylabel("accuracy")
  ax.set_title(title)
  ax.legend(loc="lower right", fontsize=8)
  return fig


def mix_weights(weights: Mapping[str, Sequence[float]], title: str = "", ax: Axes | None = None) -> Figure:
  """Grouped bars of softmax-normalised layer weights, one series per name (e.g. trained/untrained, or
  one per task)."""
  series = {name: w for name, w in weights.items() if w}
  n = max((len(w) for w in series.values()), default=0)
  x = np.arange(n)
  width = 0.8 / max(len(series), 1)
  fig, ax = _figure(ax, (1.2 * n + 2, 3.2))
  for i, (name, w) in enumerate(series.items()):
    bars = ax.bar(x[:len(w)] + (i - (len(series) - 1) / 2) * width, w, width=width, label=name,
                  color=_MODEL_COLOURS.get(name))
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
  ax.set_xticks(x, [f"layer_{i}" for i in range(n)])
  ax.set_ylim(0, 1.05)
  ax.set_ylabel("mix weight (softmax)")
  ax.set_title(title)
  ax.legend(fontsize=8)
  return fig


def probe_mix_weights(result: dict[str, Any], title: str, ax: Axes | None = None) -> Figure:
  """`mix_weights` of a probe result: the learned mix of the trained vs the untrained model."""
  return mix_weights({m: result.get(m, {}).get("mix_weights") for m in ("trained", "untrained")}, title, ax)


def wsd_pca(label: str, senses: Sequence[str], coords: np.ndarray,
            axes: Sequence[Axes] | None = None) -> Figure:
  """One panel per layer: 2-D PCA of a lemma's occurrences coloured by sense.

  Args:
    coords: (L, K, 2) coordinates, K occurrences.
    axes: L axes to draw on (default: a new figure with one row of panels).
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  n_layers = coords.shape[0]
  names = sorted(set(senses))
  cmap = matplotlib.colormaps["tab10"]
  if axes is None:
    fig = Figure(figsize=(3.2 * n_layers, 3.2))
    axes = fig.subplots(1, n_layers, squeeze=False)[0]
  fig = axes[0].figure
  for layer, ax in enumerate(axes):
    for s_i, name in enumerate(names):
      pts = coords[layer, [i for i, s in enumerate(senses) if s == name]]
      ax.scatter(pts[:, 0], pts[:, 1], s=18, color=cmap(s_i % 10), label=name, alpha=0.8)
    ax.set_title(f"layer_{layer}")
    ax.set_xticks([])
    ax.set_yticks([])
  axes[-1].legend(fontsize=6, loc="best")
  fig.suptitle(f"WSD: occurrences of '{label}' by sense (PCA)", y=1.04)
  return fig


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


def perplexity_curves(metrics_path: str, ax: Axes | None = None) -> Figure:
  """Train and eval perplexity (forward, backward, mean) against step, log scale, and the unigram
  baseline when the run logged it.

  Eval lines carry `eval_ppl_forward/backward/eval_ppl`; train lines carry
  `train_ppl_forward/backward`. Lines without a `step` are ignored. ValueError if there is nothing to plot.
  """
  rows = [r for r in read_metrics(metrics_path) if "step" in r]
  series = {
      "train forward": ("train_ppl_forward", "tab:blue", ":"),
      "train backward": ("train_ppl_backward", "tab:orange", ":"),
      "eval forward": ("eval_ppl_forward", "tab:blue", "-"),
      "eval backward": ("eval_ppl_backward", "tab:orange", "-"),
      "eval mean": ("eval_ppl", "black", "-"),
  }
  curves = {}
  for name, (key, _, _) in series.items():
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
    if pts:
      curves[name] = pts
  if not curves:
    raise ValueError(f"{metrics_path}: no perplexity values to plot")
  fig, ax = _figure(ax, (6, 3.8))
  for name, pts in curves.items():
    key, colour, style = series[name]
    steps, vals = zip(*pts)
    ax.plot(steps, vals, style, color=colour, label=name,
            marker="o" if key.startswith("eval") and len(pts) < 30 else None, markersize=3)
  unigram = [r["unigram_ppl"] for r in rows if isinstance(r.get("unigram_ppl"), (int, float))]
  if unigram:
    ax.axhline(unigram[0], color="grey", lw=0.8, label="unigram (eval split)")
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("perplexity")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  return fig


def perplexity_bars(ax: Axes | None, result: Mapping[str, Any]) -> Figure:
  """One model's forward / backward / mean perplexity vs the unigram baseline (evaluate.py's perplexity.json),
  linear from 0: log bars exaggerate gaps. `ax`: the axes to draw on (None: a new figure)."""
  names = ["forward", "backward", "mean", "unigram"]
  values = [result["ppl_forward"], result["ppl_backward"], result["ppl"], result.get("unigram_ppl")]
  keep = [(n, v) for n, v in zip(names, values) if v is not None and np.isfinite(v)]
  fig, ax = _figure(ax, (5, 3.4))
  colours = {"forward": "tab:blue", "backward": "tab:orange", "mean": "black", "unigram": "tab:grey"}
  bars = ax.bar([n for n, _ in keep], [v for _, v in keep], color=[colours[n] for n, _ in keep])
  ax.bar_label(bars, fmt="%.1f", fontsize=8)
  ax.set_ylim(0, 1.12 * max(v for _, v in keep))
  ax.set_ylabel("perplexity (lower is better)")
  ax.set_title(f"biLM vs unigram perplexity ({result['n_tokens']:,} targets per direction)", fontsize=9)
  return fig


def perplexity_by_model(ax: Axes | None, results: Mapping[str, Mapping[str, Any]]) -> Figure:
  """Several models side by side: forward / backward / unigram perplexity grouped by name ({name: a
  perplexity result}), log scale. `ax`: the axes to draw on (None: a new figure)."""
  names = list(results)
  x = np.arange(len(names))
  fig, ax = _figure(ax, (2.2 * len(names) + 3, 3.6))
  for offset, key, colour in ((-0.27, "ppl_forward", "tab:blue"), (0.0, "ppl_backward", "tab:cyan"),
                              (0.27, "unigram_ppl", "tab:grey")):
    vals = [results[n].get(key) for n in names]
    vals = [np.nan if v is None else v for v in vals]
    ax.bar_label(ax.bar(x + offset, vals, width=0.27, label=key.replace("_ppl", "").replace("ppl_", ""),
                        color=colour), fmt="%.0f", fontsize=7)
  ax.set_yscale("log")
  # Path-like names of more than a few groups overlap unless slanted.
  slant = {"rotation": 20, "ha": "right"} if len(names) > 4 else {}
  ax.set_xticks(x, names, fontsize=8, **slant)
  ax.set_ylabel("perplexity")
  ax.set_title("biLM perplexity vs unigram")
  ax.legend(fontsize=8)
  return fig
