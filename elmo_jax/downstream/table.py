"""The settings side by side: test accuracy per task x ELMo setting, mean ± std over seeds, of finished runs'
results.json (`find_results`, `summarise`, `markdown`; the command: `elmo_jax/cli/downstream_table.py`). std is
the sample standard deviation over seeds (ddof=1; 0 for one seed).
"""
from __future__ import annotations

import collections
import os
from typing import Any, Sequence

import numpy as np

_ORDER = {"none": 0, "frozen": 1, "finetune": 2}


def find_results(paths: Sequence[str]) -> list[str]:
  """results.json files named by `paths` (files, run dirs, or dirs searched recursively), sorted."""
  found = []
  for path in paths:
    if os.path.isfile(path):
      found.append(path)
    elif os.path.isdir(path):
      hits = [os.path.join(root, "results.json") for root, _, names in os.walk(path) if "results.json" in names]
      if not hits:
        raise FileNotFoundError(f"{path}: no results.json under it")
      found.extend(hits)
    else:
      raise FileNotFoundError(f"{path}: not found")
  return sorted(set(found))


def setting_of(result: dict[str, Any], name_bilm: bool = False) -> str:
  """'none', 'frozen', 'finetune', plus '+output' (second mix at the output) and ' (random biLM)';
  with `name_bilm`, the biLM's run directory too (tables that compare several biLMs)."""
  name = result["elmo"]
  model = result.get("settings", {}).get("model", {})
  if name != "none" and model.get("elmo_at_output"):
    name += "+output"
  if name != "none" and (result.get("bilm") or {}).get("init") == "random":
    name += " (random biLM)"
  if name_bilm and result.get("bilm"):
    name += f" [{os.path.basename(os.path.normpath(result['bilm']['spec']))}]"
  return name


def summarise(results: Sequence[dict[str, Any]], sources: Sequence[str] | None = None) -> dict[str, Any]:
  """{"rows": [{task, setting, elmo, n, seeds, values, mean, std, dev_mean, delta_vs_none}], "runs": [...]}."""
  groups: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
  several = len({(r.get("bilm") or {}).get("weights_sha256") for r in results} - {None}) > 1
  for r in results:
    groups[(r["task"], setting_of(r, several))].append(r)
  rows = []
  for (task, setting), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], _ORDER.get(kv[1][0]["elmo"], 9),
                                                                         kv[0][1])):
    values = [float(r["test_accuracy"]) for r in runs]
    rows.append({"task": task, "setting": setting, "elmo": runs[0]["elmo"], "n": len(runs),
                 "seeds": sorted(r["seed"] for r in runs), "values": values,
                 "mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                 "dev_mean": float(np.mean([r["dev_accuracy"] for r in runs])),
                 "bilm_sha256": sorted({(r.get("bilm") or {}).get("weights_sha256") or "" for r in runs} - {""})})
  base = {r["task"]: r["mean"] for r in rows if r["setting"] == "none"}
  for r in rows:
    r["delta_vs_none"] = r["mean"] - base[r["task"]] if r["task"] in base else None
  return {"rows": rows, "runs": list(sources or [])}


def markdown(summary: dict[str, Any]) -> str:
  lines = ["| task | setting | test accuracy (mean ± std) | Δ vs none | dev accuracy | seeds |",
           "|---|---|---|---|---|---|"]
  for r in summary["rows"]:
    delta = "" if r["delta_vs_none"] is None or r["setting"] == "none" else f"{r['delta_vs_none']:+.4f}"
    lines.append(f"| {r['task']} | {r['setting']} | {r['mean']:.4f} ± {r['std']:.4f} | {delta} | "
                 f"{r['dev_mean']:.4f} | {r['n']} |")
  return "\n".join(lines) + "\n"
