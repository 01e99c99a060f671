"""The test suite's time by file and by tier (quick / slow), as one JSON object.

    python benchmarks/test_times.py                         # runs `bash scripts/test.sh` (2 workers), then reports
    python benchmarks/test_times.py -- -n 0 -m "not slow"   # arguments after -- go to pytest (here: serial quick tier)
    python benchmarks/test_times.py --junit=FILE            # reports an earlier run's junit XML (no run)

Each test's time is pytest's junit `time` (setup + call + teardown: a module fixture's cost lands on the test
that first asks for it). The tier of a test is its `slow` marker, read by collecting `-m slow` (a few seconds,
no test runs). `wall_sec` is the run's own wall time (with workers, less than the sum of the tests' times).
Prints: {"wall_sec", "tests", "passed", "failed", "skipped", "sum_sec", "tiers": {"quick": {...}, "slow": {...}},
"files": {path: {"tests", "sec", "slow_sec"}} (slowest first), "slowest": [[sec, test id], ...] (top 25)}.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def slow_ids() -> set[str]:
  """Test ids carrying the `slow` marker (`pytest --collect-only -m slow`)."""
  out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "-p", "no:xdist",
                        "tests"], cwd=REPO, capture_output=True, text=True, check=False).stdout
  return {line.strip() for line in out.splitlines() if "::" in line}


def read_junit(path: str) -> list[dict]:
  """One row per test case: id (`tests/x/test_y.py::name[param]`), file, seconds, outcome."""
  rows = []
  for case in ET.parse(path).iter("testcase"):
    module, name = case.get("classname", ""), case.get("name", "")
    parts = module.split(".")
    # classname is "tests.room.test_file" or "tests.room.test_file.TestClass"
    file_parts = parts if not parts[-1][:1].isupper() else parts[:-1]
    test_file = "/".join(file_parts) + ".py"
    test_id = f"{test_file}::" + (f"{parts[-1]}::" if file_parts != parts else "") + name
    outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
               else "skipped" if case.find("skipped") is not None else "passed")
    rows.append({"id": test_id, "file": test_file, "sec": float(case.get("time", 0.0)), "outcome": outcome})
  return rows


def summarise(rows: list[dict], slow: set[str], wall: float | None) -> dict:
  tiers = {"quick": collections.Counter(), "slow": collections.Counter()}
  files: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for r in rows:
    tier = "slow" if r["id"] in slow else "quick"
    tiers[tier]["tests"] += 1
    tiers[tier]["sec"] += r["sec"]
    files[r["file"]]["tests"] += 1
    files[r["file"]]["sec"] += r["sec"]
    files[r["file"]]["slow_sec"] += r["sec"] if tier == "slow" else 0.0
  outcomes = collections.Counter(r["outcome"] for r in rows)
  rounded = lambda c: {k: round(v, 1) if isinstance(v, float) else v for k, v in c.items()}  # noqa: E731
  return {
      "wall_sec": round(wall, 1) if wall is not None else None,
      "tests": len(rows), "passed": outcomes["passed"], "failed": outcomes["failed"],
      "skipped": outcomes["skipped"], "sum_sec": round(sum(r["sec"] for r in rows), 1),
      "tiers": {k: rounded(v) for k, v in tiers.items()},
      "files": {f: rounded(c) for f, c in sorted(files.items(), key=lambda kv: -kv[1]["sec"])},
      "slowest": [[round(r["sec"], 1), r["id"]] for r in sorted(rows, key=lambda r: -r["sec"])[:25]],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--junit", help="report this junit XML instead of running the suite")
  parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest (scripts/test.sh)")
  args = parser.parse_args()
  wall = None
  junit = args.junit
  if junit is None:
    junit = os.path.join(tempfile.mkdtemp(prefix="test-times-"), "junit.xml")
    start = time.perf_counter()
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "test.sh"), f"--junitxml={junit}", "-p",
                           "no:cacheprovider", *args.pytest_args], cwd=REPO, stdout=sys.stderr, check=False)
    wall = time.perf_counter() - start
    if not os.path.exists(junit):
      sys.exit(f"error: pytest wrote no junit XML (exit {proc.returncode})")
  print(json.dumps(summarise(read_junit(junit), slow_ids(), wall), indent=1))


if __name__ == "__main__":
  main()
