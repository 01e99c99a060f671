"""Plots of the downstream results; each draws on a given matplotlib `ax` (the notebook calls them too).

Saving, the per-layer probe bars and the perplexity bars are `elmo_jax.evaluation.plots` (`save`,
`layer_scores`, `perplexity_by_model`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np


SETTING_COLOURS = {"none": "tab:grey", "frozen": "tab:blue", "finetune": "tab:orange"}


def dev_curve(ax, results: Sequence[dict[str, Any]]) -> None:
  """Dev accuracy per epoch of one or more runs (results.json dicts); the best epoch marked."""
  for r in results:
    epochs = [row["epoch"] for row in r["dev_curve"]]
    acc = [row["dev_accuracy"] for row in r["dev_curve"]]
    colour = SETTING_COLOURS.get(r.get("elmo"))
    ax.plot(epochs, acc, marker="o", ms=3, color=colour, label=f"{r['task']} {r['elmo']} seed {r['seed']}")
    ax.plot([r["best_epoch"]], [r["dev_accuracy"]], marker="*", ms=10, color=colour)
  ax.set_xlabel("epoch")
  ax.set_ylabel("dev accuracy")
  ax.set_title("dev accuracy per epoch (star: best, its params are tested)")
  ax.legend(fontsize=7)


def settings_bars(ax, summary: dict[str, Any], task: str) -> None:
  """Test accuracy of none / frozen / finetune (mean over seeds, error bar = std, dots = seeds) for `task`,
  from `elmo_jax.downstream.table.summarise`'s output."""
  rows = [r for r in summary["rows"] if r["task"] == task]
  names = [r["setting"] for r in rows]
  x = np.arange(len(rows))
  means = [r["mean"] for r in rows]
  bars = ax.bar(x, means, yerr=[r["std"] for r in rows], capsize=4,
                color=[SETTING_COLOURS.get(r["elmo"], "tab:green") for r in rows])
  ax.bar_label(bars, fmt="%.3f", fontsize=7, label_type="center")
  for i, r in enumerate(rows):
    ax.plot([i] * len(r["values"]), r["values"], "k.", ms=4)
  lo = min((min(r["values"]) for r in rows), default=0.0)
  ax.set_ylim(max(0.0, lo - 0.05), min(1.0, max(means, default=1.0) + 0.05))
  ax.set_xticks(x, names, fontsize=8)
  ax.set_ylabel("test accuracy")
  ax.set_title(f"{task}: task model test accuracy (mean ± std over seeds)")
