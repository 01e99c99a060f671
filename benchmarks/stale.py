"""Which records of the results store are stale: their `sources` changed since the record's commit.

    python benchmarks/stale.py            # one line per stale record: id, commit, commits of its code since
    python benchmarks/stale.py --json     # the same as JSON: {record id: {"commit", "since", "figures"}}
    python benchmarks/stale.py --until=REV   # as of another commit (the pages' notes: the one figures.md names)

A record is stale when `git log COMMIT..HEAD -- SOURCES` counts one commit or more (a commit this clone does
not hold counts as stale, `since` null). The pages say the same: `benchmarks/figures.py --write` puts
"measured at `COMMIT`, N commits of its code since" after a stale record's figures, and the docs build prints
this list (docs/_hooks/figures.py). The pages count up to the commit `--write` ran on, which docs/figures.md
names, so a later commit does not make them wrong, only the list here longer until the next `--write`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record  # pylint: disable=g-import-not-at-top,wrong-import-position


def commits_since(commit: str, sources: list[str], repo: str = record.REPO, until: str = "HEAD") -> int | None:
  """Commits after `commit` up to `until` that touch `sources`; None where the clone lacks either."""
  if not commit or commit == "unknown":
    return None
  try:
    out = subprocess.run(["git", "rev-list", "--count", f"{commit}..{until}", "--", *sources], cwd=repo,
                         capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return None
  return int(out.strip() or 0)


def stale_records(store: dict[str, dict] | None = None, repo: str = record.REPO,
                  until: str = "HEAD") -> dict[str, dict[str, Any]]:
  """{record id: {"commit", "since", "figures": [figure ids]}} for every record of the store whose sources
  changed between its commit and `until`."""
  store = record.read_store(os.path.join(repo, "results")) if store is None else store
  out = {}
  for rid, data in sorted(store.items()):
    meta = data["record"]
    sources = meta.get("sources") or []
    if not sources:
      continue
    since = commits_since(meta.get("commit", ""), sources, repo, until)
    if since is None or since > 0:
      out[rid] = {"commit": meta.get("commit"), "since": since,
                  "figures": sorted(f"{rid}:{key}" for key in data["figures"])}
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--json", action="store_true", help="print {record id: {commit, since, figures}}")
  parser.add_argument("--until", default="HEAD", help="count the commits up to this one (the pages: the commit "
                      "docs/figures.md names)")
  args = parser.parse_args(argv)
  stale = stale_records(until=args.until)
  if args.json:
    print(json.dumps(stale, indent=1))
    return 0
  for rid, s in stale.items():
    since = "a commit this clone lacks" if s["since"] is None else f"{s['since']} commits of its code since"
    print(f"{rid}: measured at {s['commit']}, {since} ({len(s['figures'])} figures)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
