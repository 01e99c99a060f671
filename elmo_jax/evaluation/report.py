"""Plain-text/markdown tables of probe results and the `report.md` of `--task=all`."""
from __future__ import annotations

import os
from typing import Any

from elmo_jax.evaluation.plots import score_keys


def _fmt(value: Any) -> str:
  return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def table(result: dict[str, Any]) -> str:
  """Markdown table: one row per layer (+ mix), trained vs untrained columns."""
  trained, untrained = result["trained"], result.get("untrained", {})
  has_ties = any(k.endswith("_ties") for k in trained)
  has_answerable = any(k.endswith("_answerable") for k in trained)
  head = ["", "trained", "untrained"]
  if has_ties:
    head += ["ties (trained)", "ties (untrained)"]
  if has_answerable:
    head += ["answerable rows: trained", "answerable rows: untrained"]
  if trained.get("mix_weights"):
    head += ["mix weight (trained)", "mix weight (untrained)"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for key in score_keys(trained):
    row = [key, _fmt(trained.get(key)), _fmt(untrained.get(key))]
    if has_ties:
      row += [_fmt(trained.get(f"{key}_ties")), _fmt(untrained.get(f"{key}_ties"))]
    if has_answerable:
      row += [_fmt(trained.get(f"{key}_answerable")), _fmt(untrained.get(f"{key}_answerable"))]
    if trained.get("mix_weights"):
      i = int(key[6:]) if key.startswith("layer_") else None
      pick = lambda r: r.get("mix_weights")[i] if i is not None and r.get("mix_weights") else None  # noqa: E731
      row += [_fmt(pick(trained)), _fmt(pick(untrained))]
    lines.append("| " + " | ".join(row) + " |")
  lines.append(f"\nn = {trained.get('n')} examples scored")
  if has_answerable:
    lines[-1] += (f"; {trained.get('n_answerable')} answerable (their sense has another example in the "
                  "group; the others cannot be right under leave-one-out)")
  majority = result.get("data", {}).get("majority_baseline")
  if majority is not None:
    lines[-1] += f"; majority-class baseline {majority:.3f}"
  return "\n".join(lines)




def markdown_report(results: dict[str, dict[str, Any]], out_dir: str) -> str:
  """The report.md text: per task a table, extra protocol tables and plot links."""
  parts = ["# ELMo evaluation report", ""]
  for task, result in results.items():
    parts.append(f"## {task}")
    parts.append("")
    if "skipped" in result:
      parts += [f"Skipped: {result['skipped']}", ""]
      continue
    if "trained" in result:
      parts += [table(result), ""]
    elif task == "perplexity":
      from elmo_jax.evaluation import perplexity  # pylint: disable=g-import-not-at-top  (no cycle)
      parts += [perplexity.table(result), "", f"Convention: {result['convention']}", ""]
    if "centroid" in result:
      parts += ["Sense-centroid protocol (train centroids, 1-NN on test):", "",
                table(result["centroid"]), ""]
    if result.get("rule"):
      parts += [f"Rule: {result['rule']}", ""]
    for plot in result.get("plots", []):
      rel = os.path.relpath(plot, out_dir)
      parts += [f"![{os.path.basename(plot)}]({rel})", ""]
  return "\n".join(parts)
