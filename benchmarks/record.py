"""The results store's one writer: a record is one measurement, its figures and what they were measured on.

A record is a JSON file under `results/` (`results/<folder>/<name>.json`; its id is `<folder>/<name>`):

    {"record": {"id", "kind": "benchmark" | "compile" | "legacy", "command", "commit", "dirty", "date",
                "load_before", "load_after", "sources": [paths the measurement depends on],
                "machine": {"fingerprint": id | "unknown (before the store)", "name", "static", "measured"}},
     "figures": {key: {"value": number, "unit": str, ...}},
     ...the benchmark's own payload, unchanged}

A figure's id is `<record id>:<key>` (`latency/embed_latency_small:batch_1.p50_ms`); the pages show it through
a span that `benchmarks/figures.py` rewrites. Both sides of a ratio come from one record: a ratio is a figure
of the record that measured both, never formed from two records. The fingerprint id hashes the machine's
static part (CPU model, family, ISA flags, cores, memory, accelerator), not the measured peaks, so reruns on one
machine share it and `docs/figures.md` groups them in one table.

    from benchmarks import record                 # import early: the load average is taken at import
    record.write_record("results/latency/x.json", figures=record.flatten(result), command="...",
                        sources=["elmo_jax/embedding"], payload=result)

or, for a benchmark that prints one JSON object (what benchmarks/run_all.sh does with each):

    python benchmarks/portable_latency.py | python benchmarks/record.py --out=results/portable/x.json \
        --command="python benchmarks/portable_latency.py" --sources=elmo_jax/embedding,benchmarks/portable_latency.py \
        --load_before="$(cut -d' ' -f1-3 /proc/loadavg)" [--ratio=NAME=A/B ...]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable, Mapping

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "results")
UNKNOWN = "unknown (before the store)"
COMPILE_NOTE = ("a compile analysis for the target's chips on this CPU, without them (XLA's own TPU / GPU compiler): "
                "bytes, FLOPs and bounds, not a timing, so the load average does not move it")
LOAD_AT_START = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None

# ISA flags worth naming: what XLA:CPU's matmuls and the LSTM kernels use.
_ISA = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_bf16",
        "amx_int8", "amx_tile", "neon", "asimd", "sve")


def _cpuinfo() -> dict[str, Any]:
  """CPU model, family and ISA flags from /proc/cpuinfo (Linux); the platform's processor name elsewhere."""
  info: dict[str, Any] = {"model": platform.processor() or platform.machine(), "family": None, "isa": []}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return info
  fields: dict[str, str] = {}
  for line in text.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  info["model"] = fields.get("model name") or fields.get("Processor") or info["model"]
  family = fields.get("cpu family")
  info["family"] = f"{fields.get('vendor_id', '')} family {family} model {fields.get('model', '')}".strip() \
      if family else None
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  info["isa"] = [f for f in _ISA if f in flags]
  return info


def _memory_gib() -> float | None:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return round(int(line.split()[1]) / 2**20, 1)
  except OSError:
    pass
  return None


def _accelerator() -> str | None:
  """The first device's kind where it is not a CPU (`NVIDIA H100 80GB HBM3`, `TPU v5 lite`), else None."""
  try:
    import jax  # pylint: disable=g-import-not-at-top  (the static part is read without jax where it is absent)
    devices = jax.devices()
  except Exception:  # pylint: disable=broad-except  (no backend: a CPU machine all the same)
    return None
  kinds = sorted({d.device_kind for d in devices if d.platform != "cpu"})
  return f"{len(devices)} x {kinds[0]}" if kinds else None


def memory_bandwidth(mb: int = 256, reps: int = 5) -> float:
  """Best bytes/s of a numpy copy of an `mb` MB float32 array (read + write counted), past every cache."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  src = np.ones(mb * 2**20 // 4, np.float32)
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - t)
  return 2.0 * src.nbytes / best


def static_machine() -> dict[str, Any]:
  """What does not change between runs on one machine: the fingerprint id hashes exactly this."""
  cpu = _cpuinfo()
  return {"cpu_model": cpu["model"], "cpu_family": cpu["family"], "isa": cpu["isa"], "cores": os.cpu_count(),
          "memory_gib": _memory_gib(), "accelerator": _accelerator()}


def fingerprint_id(static: Mapping[str, Any]) -> str:
  """A short stable id of a machine's static part (8 hex digits)."""
  return hashlib.sha256(json.dumps(static, sort_keys=True).encode()).hexdigest()[:8]


def machine_fingerprint(measure: bool = True, compiled_for: str | None = None) -> dict[str, Any]:
  """The machine: `fingerprint` (id), `static` (CPU, ISA, cores, memory, accelerator) and, with `measure`,
  `measured` (the matmul peak and the memory bandwidth, a few seconds of micro-benchmark now). `compiled_for`:
  a compile analysis for a target's chips without them (`v5e:2x2`): the target is part of the static part,
  so each target has a fingerprint of its own."""
  static = static_machine()
  if compiled_for:
    static["compiled_for"] = compiled_for
  out: dict[str, Any] = {"fingerprint": fingerprint_id(static), "static": static}
  if measure:
    try:  # jax only when measuring; `python benchmarks/x.py` has benchmarks/ on the path, a test the clone
      import bench_util  # pylint: disable=g-import-not-at-top
    except ImportError:
      from benchmarks import bench_util  # pylint: disable=g-import-not-at-top
    out["measured"] = {"matmul_peak_flops": round(bench_util.matmul_peak(), -6),
                       "memory_bandwidth_bytes_per_s": round(memory_bandwidth(), -6)}
  return out


def git_commit(repo: str = REPO) -> tuple[str, bool]:
  """(short HEAD, whether the work tree differs from it outside results/: a sweep's own records written so far
  do not make the next one dirty); ("unknown", False) outside a clone."""
  def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
  try:
    return git("rev-parse", "--short=7", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no", "--",
                                                          ".", ":(exclude)results"))
  except (OSError, subprocess.CalledProcessError):
    return "unknown", False


# (a word of a key's part, its unit), first match wins: `p50_over_embedder` is a ratio before it is anything.
_UNITS = (("over", "x"), ("ratio", "x"), ("sentences", "sentences/s"), ("tokens", "tokens/s"),
          ("requests", "requests/s"), ("gbytes", "GB/s"), ("gflops", "GFLOP/s"), ("mflops", "MFLOP"),
          ("flops", "FLOP/s"), ("ms", "ms"), ("s", "s"), ("sec", "s"), ("seconds", "s"), ("mb", "MB"),
          ("gb", "GB"))


def unit_of(key: str) -> str:
  """A figure's unit read off its key's parts, last first (`batch_1.ms.p50` -> ms, `rss_mb` -> MB,
  `floor_ms_p50` -> ms, `max_over_p50` -> x); "" for a count."""
  for part in reversed(key.split(".")):
    words = part.split("_")
    per_s = any(words[i:i + 2] == ["per", "s"] for i in range(1, len(words) - 1))  # tokens_per_s_per_device
    for word, unit in _UNITS:
      if word in words and (unit.endswith("/s") == per_s or unit in ("x", "GFLOP/s", "FLOP/s")):
        return unit
  return ""


def flatten(payload: Any, prefix: str = "", skip: Iterable[str] = ("record", "figures")) -> dict[str, dict]:
  """Every number of a benchmark's JSON as a figure: `{"a.b.c": {"value", "unit"}}` (list items by index;
  booleans and strings are not figures)."""
  out: dict[str, dict] = {}
  items = (payload.items() if isinstance(payload, dict) else enumerate(payload)
           if isinstance(payload, list) else ())
  for key, value in items:
    if not prefix and key in skip:
      continue
    path = f"{prefix}{key}"
    if isinstance(value, (dict, list)):
      out.update(flatten(value, path + ".", skip))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      out[path] = {"value": value, "unit": unit_of(path)}
  return out


def _atomic_json(path: str, data: Mapping[str, Any]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".record-", suffix=".tmp")
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump(data, f, indent=1, sort_keys=False)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def record_id(path: str, root: str = RESULTS) -> str:
  """`results/latency/x.json` -> `latency/x` (the path under results/, without .json)."""
  rel = os.path.relpath(os.path.abspath(path), root)
  if rel.startswith(".."):
    raise ValueError(f"{path}: a record lives under {root}")
  return rel[:-len(".json")] if rel.endswith(".json") else rel


def write_record(path: str, figures: Mapping[str, Mapping[str, Any]], command: str, sources: Iterable[str],
                 payload: Mapping[str, Any] | None = None, kind: str = "benchmark",
                 machine: Mapping[str, Any] | None = None, measure_machine: bool = True,
                 root: str = RESULTS, note: str | None = None) -> dict:
  """Writes one record atomically to `path` (under results/) and returns it: `figures` ({key: {value, unit}}),
  the `command` that measured them, the `sources` (repository paths) they depend on, the commit, date, the load
  average at import of this module and now, the machine's fingerprint (measured now unless `machine` is given)
  and the benchmark's `payload` beside them; `note`, a line on what kind of figure it is (a compile analysis)."""
  for key, fig in figures.items():
    if ":" in key or "value" not in fig or "unit" not in fig:
      raise ValueError(f"{path}: figure {key!r} needs a value and a unit and no ':' in its key")
  commit, dirty = git_commit()
  meta = {"id": record_id(path, root), "kind": kind, "command": command, "commit": commit, "dirty": dirty,
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
          "load_before": LOAD_AT_START, "load_after": None, "sources": sorted(set(sources)),
          "machine": dict(machine) if machine is not None else machine_fingerprint(measure_machine)}
  meta["load_after"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
  if note:
    meta["note"] = note
  data = {"record": meta, "figures": {k: dict(v) for k, v in figures.items()}}
  data.update({k: v for k, v in (payload or {}).items() if k not in ("record", "figures")})
  _atomic_json(path, data)
  return data


def read_store(root: str = RESULTS) -> dict[str, dict]:
  """Every record under `root`: {record id: the record}; JSON files without `record` and `figures` (run
  outputs such as results/reference/) are not records."""
  store = {}
  for folder, _, names in os.walk(root):
    for name in sorted(names):
      if not name.endswith(".json"):
        continue
      path = os.path.join(folder, name)
      with open(path, encoding="utf-8") as f:
        try:
          data = json.load(f)
        except ValueError as e:
          raise ValueError(f"{path}: not JSON ({e})") from None
      if isinstance(data, dict) and "record" in data and "figures" in data:
        rid = os.path.relpath(path, root)[:-len(".json")]
        store[rid] = data
  return store


def main(argv: list[str] | None = None) -> int:
  """Reads a benchmark's JSON object on stdin and writes it as a record (every number a figure)."""
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("--out", required=True, help="the record's path under --root (results/FOLDER/NAME.json)")
  parser.add_argument("--root", default=RESULTS, help="the results store's folder")
  parser.add_argument("--command", required=True, help="the command that measured it")
  parser.add_argument("--sources", default="", help="comma-separated repository paths the figures depend on")
  parser.add_argument("--load_before", default=None, help="the load average (1, 5, 15 min) before the run")
  parser.add_argument("--ratio", action="append", default=[],
                      help="NAME=A/B: a ratio of two figures of this record (both sides from one run)")
  parser.add_argument("--flops", action="append", default=[],
                      help="FIGURE=OTHER: OTHER's value is FIGURE's FLOPs per unit (per token of a tokens/s), so "
                           "the pages can show FIGURE as a fraction of the machine's matmul peak")
  parser.add_argument("--floor", action="append", default=[],
                      help="FIGURE=OTHER: OTHER is FIGURE at the run's memory-bandwidth floor (same unit)")
  parser.add_argument("--nomeasure", action="store_true", help="no matmul peak / bandwidth micro-benchmark")
  parser.add_argument("--compiled_for", default=None,
                      help="TARGET: a compile analysis for TARGET's chips on this CPU without them (bytes, FLOPs, "
                           "bounds; no timing, so the load does not matter): kind `compile`, the machine this "
                           "CPU and TARGET, no micro-benchmark")
  args = parser.parse_args(argv)
  text = sys.stdin.read()
  try:  # a benchmark may print lines before its JSON object: read from the first line that opens one
    payload = json.loads(text[text.index("\n{") + 1:] if not text.startswith("{") and "\n{" in text else text)
  except ValueError as e:
    print(f"record.py: stdin is not one JSON object ({e})", file=sys.stderr)
    return 1
  figures = flatten(payload)
  for ratio in args.ratio:
    name, _, expr = ratio.partition("=")
    a, _, b = expr.partition("/")
    if a not in figures or b not in figures:
      print(f"record.py: --ratio={ratio}: {a if a not in figures else b} is not a figure of this run", file=sys.stderr)
      return 1
    figures[name] = {"value": round(figures[a]["value"] / figures[b]["value"], 3), "unit": "x"}
  for spec, field in [(s, "flops") for s in args.flops] + [(s, "floor") for s in args.floor]:
    name, _, other = spec.partition("=")
    if name not in figures or other not in figures:
      print(f"record.py: --{field}={spec}: {name if name not in figures else other} is not a figure of this run",
            file=sys.stderr)
      return 1
    figures[name][field] = figures[other]["value"]
  if args.load_before:
    global LOAD_AT_START  # pylint: disable=global-statement  (the run began before this process)
    LOAD_AT_START = [float(x) for x in args.load_before.split()]
  sources = [s for s in args.sources.split(",") if s]
  if args.compiled_for:
    out = write_record(args.out, figures, args.command, sources, payload, kind="compile",
                       machine=machine_fingerprint(False, args.compiled_for), root=args.root, note=COMPILE_NOTE)
  else:
    out = write_record(args.out, figures, args.command, sources, payload, measure_machine=not args.nomeasure,
                       root=args.root)
  print(f"{args.out}: {len(figures)} figures, machine {out['record']['machine']['fingerprint']}, "
        f"commit {out['record']['commit']}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
