"""The planner over many targets (docs/pods.md's scaling table); prints one JSON object and a markdown table.

    PYTHONPATH=. python benchmarks/plan_sweep.py --out=/tmp/sweep \
        --targets=v5e:2x2,v5e:4x4,v5e:8x8,v5e:16x16,v6e:16x16,h200:1x1x8,h200:1x2x8
    PYTHONPATH=. python benchmarks/plan_sweep.py --out=/tmp/sweep --reanalyse   # from the saved HLO, no compile
    PYTHONPATH=. python benchmarks/plan_sweep.py --out=/tmp/sweep --record_dir=results/plan   # and a record each

Each target is one `python -m elmo_jax plan --json --dump_hlo` subprocess (a full lm1b compile takes minutes on
2 cores; libtpu allows one process at a time unless ALLOW_MULTIPLE_LIBTPU_LOAD=1), writing
`OUT/<target>.json` and `.hlo`; an existing JSON is kept, so a rerun continues. `--reanalyse` recomputes the
HLO-derived fields (FLOPs, traffic, collectives, roofline) of every saved pair with this tree's
`elmo_jax.plan`. `--repo` runs another checkout's step (e.g. a `git worktree` of an older commit with this
`elmo_jax/plan/` copied in) for before/after tables. Needs libtpu / the CUDA plugin for TPU / GPU targets
(`pip install -e ".[plan-tpu]" ".[plan-gpu]"`). `--record_dir`: each target's report also as a record of the
results store (benchmarks/record.py, `lm1b_<target>_rows<R>.json`, kind `compile`: its machine this CPU and the
target, no device; bytes, FLOPs and bounds, not timings, so the load does not move them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, _ROOT)

from elmo_jax.measure import chips as chips_lib  # noqa: E402  pylint: disable=g-import-not-at-top
from elmo_jax.measure import roofline  # noqa: E402  pylint: disable=g-import-not-at-top
from elmo_jax.plan import targets as targets_lib  # noqa: E402  pylint: disable=g-import-not-at-top
import record  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position  (benchmarks/ on the path)

EPOCH_TOKENS = 800_000_000  # lm1b's training split, as configs/lm1b.py counts it


def _name(target: str) -> str:
  return target.replace(":", "_")


def compile_target(repo: str, out: str, target: str, args) -> None:
  path = os.path.join(out, _name(target))
  if os.path.exists(path + ".json"):
    return
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  cmd = [sys.executable, "-m", "elmo_jax", "plan", f"--config={args.config}", f"--target={target}",
         f"--per_device_batch={args.rows}", "--json", f"--dump_hlo={path}.hlo", *args.flag]
  proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
  if proc.returncode:
    sys.stderr.write(f"{target}: rc {proc.returncode}\n{proc.stderr[-2000:]}\n")
    return
  with open(path + ".json", "w") as f:
    f.write(proc.stdout[proc.stdout.index("{"):])


def reanalyse(report: dict, hlo_path: str, launch_us: float) -> dict:
  """The report with its HLO-derived fields recomputed by this tree's planner (no compile)."""
  if not report.get("fits") or not os.path.exists(hlo_path):
    return report
  name, _ = targets_lib.parse(report["target"])
  chip = chips_lib.CHIPS[name]
  per_host = int(report["target"].split("x")[-1]) if chip.platform == "cuda" else report["devices"]
  target = chips_lib.Target(report["target"], chip, [None] * report["devices"], per_host, report["hbm_bytes"]["capacity"])
  with open(hlo_path) as f:
    report.update(roofline.analyse_hlo(f.read(), target, report["tokens_per_device_per_step"], launch_us))
  return report


def row(r: dict) -> dict:
  """The table's columns of one report."""
  out = {"target": r["target"], "devices": r["devices"], "rows_per_device": r["per_device_batch"], "fits": r["fits"]}
  hbm = r["hbm_bytes"]
  if not r["fits"]:
    return {**out, "hbm_gb": round(hbm.get("temporaries", 0) / 1e9, 2), "note": hbm.get("compiler_message", "")}
  coll = r["collective_bytes_per_device"]
  rf = r["roofline"]
  tokens_s = rf["tokens_per_s_per_device"] * r["devices"]
  return {**out, "hbm_gb": round(hbm["total"] / 1e9, 2), "tflops_per_device": round(r["flops_per_device_per_step"] / 1e12, 3),
          "gflop_per_token": round(r["flops_per_token"] / 1e9, 3),
          "all_gather_gb": round(coll.get("all-gather", 0) / 1e9, 3),
          "collective_gb": round(sum(coll.values()) / 1e9, 3),
          "step_ms": round(rf["step_s"] * 1e3, 2), "bound_by": rf["bound_by"],
          "compute_ms": round(rf["compute_s"] * 1e3, 2), "hbm_ms": round(rf["hbm_s"] * 1e3, 2),
          "collectives_ms": round(rf["collectives_s"] * 1e3, 2),
          "launch_ms": round(rf.get("launch_s", 0) * 1e3, 2),
          "tokens_per_s_per_device": round(rf["tokens_per_s_per_device"]),
          "all_spaces_tokens_per_s_per_device": round(r["tokens_per_device_per_step"] / max(
              rf["compute_s"], rf["collectives_s"], rf.get("launch_s", 0),
              r["hbm_traffic_all_spaces_bytes_per_step"] / r["peak"]["hbm_bytes_per_s"])),
          "hbm_traffic_gb": round(r["hbm_traffic_bytes_per_step"] / 1e9, 2),
          "hbm_traffic_all_spaces_gb": round(r["hbm_traffic_all_spaces_bytes_per_step"] / 1e9, 2),
          "collectives_mb": {k: round(v / 1e6) for k, v in coll.items()},
          "collectives_total_mb": round(sum(coll.values()) / 1e6),
          "kernel_launches": r.get("kernel_launches_per_step", 0),
          "mfu_bound": round(rf["mfu_bound"], 3),
          "lm1b_10_epochs_h": round(10 * EPOCH_TOKENS / tokens_s / 3600, 2)}


SOURCES = ["elmo_jax/plan", "elmo_jax/measure", "elmo_jax/training", "elmo_jax/model", "configs/lm1b.py",
           "benchmarks/plan_sweep.py"]
_UNITS = {"tflops_per_device": "TFLOP", "gflop_per_token": "GFLOP", "lm1b_10_epochs_h": "h", "mfu_bound": "",
          "kernel_launches": "", "devices": "", "rows_per_device": ""}


def write_record(report: dict, args, root: str) -> dict:
  """One target's report as a record (`lm1b_<target>_rows<R>.json` under --record_dir): `row.*` its table's
  columns (GB, MB, TFLOP, tokens/s per device, the bound), `report.*` every number of the planner's JSON."""
  summary = row(report)
  payload = {"row": summary, "report": report, "stack": _stack()}
  figures = record.flatten(payload)
  for key, unit in _UNITS.items():
    if f"row.{key}" in figures:
      figures[f"row.{key}"]["unit"] = unit
  if summary.get("bound_by"):  # the term that binds, by name; its value the step's bound in ms
    figures["row.bound_by"] = {"value": summary["step_ms"], "unit": "ms", "text": summary["bound_by"]}
  flags = " ".join(args.flag)
  python = os.path.relpath(sys.executable, _ROOT) if not os.path.relpath(sys.executable, _ROOT).startswith("..") \
      else "python"  # the venv names the compilers (.venv-plan: jax 0.10.2, .venv-plan-py312: 0.12)
  command = (f"{python} benchmarks/plan_sweep.py --config={args.config} --rows={args.rows} "
             f"--targets={report['target']}" + (f" --flag={flags}" if flags else ""))
  path = os.path.join(args.record_dir, f"lm1b_{_name(report['target'])}_rows{args.rows}.json")
  return record.write_record(path, figures, command, SOURCES, payload, kind="compile",
                             machine=record.machine_fingerprint(False, report["target"]), root=root,
                             note=record.COMPILE_NOTE)


def _stack() -> dict:
  """The compilers' versions: jax, jaxlib, libtpu and the CUDA plugin where installed."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  out = {}
  for name in ("jax", "jaxlib", "libtpu", "jax-cuda12-plugin"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def markdown(rows: list[dict]) -> str:
  head = ("| target | fits | HBM/chip | TFLOP/chip/step | GFLOP/token | all-gather | collectives | step (bound) "
          "| tokens/s/chip | MFU bound | 10 lm1b epochs |\n|---|---|---|---|---|---|---|---|---|---|---|")
  lines = [head]
  for x in rows:
    if not x["fits"]:
      lines.append(f"| {x['target']} | **no** ({x['hbm_gb']} GB temporaries) | | | | | | | | | |")
      continue
    lines.append(f"| {x['target']} | yes | {x['hbm_gb']} GB | {x['tflops_per_device']} | {x['gflop_per_token']} | "
                 f"{x['all_gather_gb']} GB | {x['collective_gb']} GB | {x['step_ms']} ms ({x['bound_by']}) | "
                 f"{x['tokens_per_s_per_device']:,} | {x['mfu_bound']:.1%} | {x['lm1b_10_epochs_h']} h |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--targets", default="v5e:2x2,v5e:4x4,v5e:8x8,v5e:16x16,v6e:16x16,h200:1x1x8,h200:1x2x8")
  parser.add_argument("--config", default="configs/lm1b.py")
  parser.add_argument("--rows", type=int, default=128, help="rows per device")
  parser.add_argument("--out", required=True, help="folder for <target>.json / .hlo")
  parser.add_argument("--repo", default=_ROOT, help="the checkout whose step is compiled")
  parser.add_argument("--reanalyse", action="store_true", help="recompute from the saved HLO; compile nothing")
  parser.add_argument("--launch_us", type=float, default=chips_lib.LAUNCH_US)
  parser.add_argument("--flag", action="append", default=[], help="extra planner flag, e.g. --flag=--config.dtype=float32")
  parser.add_argument("--record_dir", default="", help="also write each target's report as a record here "
                      "(under --record_root, the results store)")
  parser.add_argument("--record_root", default=record.RESULTS, help="the results store's folder")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  rows = []
  for target in args.targets.split(","):
    if not args.reanalyse:
      compile_target(os.path.abspath(args.repo), args.out, target, args)
    path = os.path.join(args.out, _name(target))
    if not os.path.exists(path + ".json"):
      continue
    with open(path + ".json") as f:
      report = reanalyse(json.load(f), path + ".hlo", args.launch_us)
    rows.append(row(report))
    if args.record_dir:
      write_record(report, args, args.record_root)
  print(json.dumps({"config": args.config, "rows_per_device": args.rows, "rows": rows}, indent=1))
  print(markdown(rows))


if __name__ == "__main__":
  main()
