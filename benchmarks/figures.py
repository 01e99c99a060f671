"""The pages' measured figures, rendered from the results store (`results/`, records of benchmarks/record.py).

    python benchmarks/figures.py --write    # rewrite every span of README.md and docs/*.md, and docs/figures.md
    python benchmarks/figures.py --check    # exit 1, naming each span or page that differs from the store

A measured figure on a page is a span, `<!--fig:RECORD:KEY-->14.9 ms<!--/fig-->` (the comments are hidden on a
forge and in the site), its options after the id, e.g. `<!--fig:RECORD:KEY .2f-->`:

    .2f, +.1f ...   a format spec for the number (default: whole numbers from 100 up, 3 significant digits below)
    bare            the number without its unit
    k               thousands: 651,757 -> 652k
    GB, MB          a figure in bytes in GB / MB (1e9 / 1e6 bytes)
    minsec          seconds as `13 min 11 s`
    machine, commit, date, load   the record's machine in a few words, its commit, its date, its load average
                    before and after
    peak            the fraction of the machine's measured matmul peak the figure runs at (it carries `flops`,
                    per unit of a rate or per call of a time)
    floor           the fraction of the memory-bandwidth floor's speed (it carries `floor`, the same quantity at
                    the floor of the same run, or `bytes` read at the fingerprint's measured bandwidth)

A record whose sources changed since its commit (benchmarks/stale.py) gets a note in each block that shows it,
`<!--stale:RECORD-->(measured at `abc1234`, N commits of its code since)<!--/stale-->`: after its last span in
a paragraph, on a line of its own under a table. `docs/figures.md` ("Measured figures") is generated: one table
per machine fingerprint, and the commit the notes count up to. A page's `<!--rows ... -->` spec is expanded
first into tables of its figures, one per machine, with each row's command, commit and date
(benchmarks/page_tables.py: docs/performance.md).
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import page_tables  # pylint: disable=g-import-not-at-top,wrong-import-position
import record  # pylint: disable=g-import-not-at-top,wrong-import-position
import stale as stale_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

SPAN = re.compile(r"<!--fig:(?P<id>[^\s>]+)(?P<opts>[^>]*?)-->(?P<text>.*?)<!--/fig-->")
STALE = re.compile(r"\s?<!--stale:(?P<rid>[^\s>]+)-->.*?<!--/stale-->")
GENERATED = "docs/figures.md"
# What reads as a measured figure in prose: a number (or a range) with a unit of time, throughput, memory, or a
# ratio written `0.84x`. A line holding `<!--fact-->` states facts (a bucket of 512 steps, a 600 s deadline).
_NUM = r"(?<![\w.,/-])[-+]?\d[\d,]*(?:\.\d+)?"
MEASURED = re.compile(
    _NUM + r"(?:\s?(?:-|–|to)\s?\d[\d,]*(?:\.\d+)?)?"  # a range: 1.67-1.74x, 5-6 minutes
    r"(?:\s?[kM](?=\s?[A-Za-z]+/s))?"  # 652k tokens/s
    r"(?:x\b|\s?(?:ms|µs|us|s|sec|seconds?|min|minutes?|h|hours?|[KMGT]i?B|kB|[A-Za-z]+/s)(?![\w/]))")
FACT = "<!--fact-->"


def pages(repo: str = record.REPO) -> list[str]:
  """The pages whose spans the store renders: README.md and docs/*.md (not the generated page)."""
  out = [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs", "*.md")))
  return [p for p in out if os.path.relpath(p, repo) != GENERATED]


def lookup(store: dict[str, dict], fid: str) -> tuple[dict, dict]:
  """(the record, the figure) of `RECORD:KEY`; KeyError naming the id where the store lacks it."""
  rid, _, key = fid.partition(":")
  if rid not in store:
    path = os.path.join(record.RESULTS, rid + ".json")
    why = ("is not a record: write it through benchmarks/record.py (bash benchmarks/run_all.sh does)"
           if os.path.exists(path) else "does not exist")
    raise KeyError(f"figure {fid!r}: results/{rid}.json {why}")
  if key not in store[rid]["figures"]:
    raise KeyError(f"figure {fid!r}: results/{rid}.json has no figure {key!r}")
  return store[rid], store[rid]["figures"][key]


def number(v: float, spec: str | None = None) -> str:
  """`v` as the pages write it: a format spec where given; else whole numbers with thousands commas from 100
  up, three significant digits below."""
  if spec:
    return format(v, spec)
  if abs(v) >= 100 or (float(v).is_integer() and abs(v) >= 1):
    return f"{round(v):,}"
  if v == 0:
    return "0"
  digits = max(0, 2 - int(math.floor(math.log10(abs(v)))))
  return f"{v:.{digits}f}"


def _measured(rec: dict, name: str) -> float | None:
  return ((rec["record"].get("machine") or {}).get("measured") or {}).get(name)


def portable(rec: dict, fig: dict, how: str) -> str:
  """What a figure is on any machine: the fraction of the record machine's measured matmul peak it runs at
  (`peak`: compute-bound work; the figure carries `flops`, per unit of a rate or per call of a time), or the
  fraction of its bandwidth floor (`floor`: memory-bound work; the figure carries `floor`, the same quantity
  at the bytes' floor of the same run, or `bytes` read, over the fingerprint's measured bandwidth)."""
  value, unit = float(fig["value"]), fig["unit"]
  seconds = value / 1e3 if unit == "ms" else value if unit == "s" else None
  if how == "peak":
    peak = fig.get("peak_flops") or _measured(rec, "matmul_peak_flops")
    if not peak or "flops" not in fig or (seconds is None and not unit.endswith("/s")):
      return "? of the matmul peak"
    rate = fig["flops"] * value if unit.endswith("/s") else fig["flops"] / seconds
    return f"{100 * rate / peak:.0f}% of the matmul peak"
  if "floor" in fig:
    return f"{100 * float(fig['floor']) / value:.0f}% of the bandwidth floor's speed"
  bandwidth = _measured(rec, "memory_bandwidth_bytes_per_s")
  if not bandwidth or "bytes" not in fig or seconds is None:
    return "? of the bandwidth floor's speed"
  return f"{100 * fig['bytes'] / bandwidth / seconds:.0f}% of the bandwidth floor's speed"


def machine_name(rec: dict) -> str:
  """A record's machine in a few words: `AMD EPYC 7B13, 2 cores, AVX2` from its fingerprint, else its name."""
  machine = rec["record"].get("machine") or {}
  static = machine.get("static") or {}
  if machine.get("fingerprint", record.UNKNOWN) == record.UNKNOWN or not static.get("cpu_model"):
    name = machine.get("name") or "an unknown machine"  # "CPU-C: a 2-core AMD EPYC VM, 24 GiB, ..."
    label, _, words = name.partition(":")
    return f"{label} ({words.split(',')[0].strip()})" if words else label
  isa = static.get("isa") or []
  widest = next((name for flag, name in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"),
                                         ("neon", "NEON"), ("asimd", "NEON")) if flag in isa), None)
  parts = [static["cpu_model"], f"{static.get('cores')} cores"] + ([widest] if widest else [])
  if static.get("compiled_for"):  # a compile analysis: the target is what the figures are about
    return f"`{static['compiled_for']}`, compiled on " + ", ".join(parts) + ", without the chips"
  return ", ".join(parts) + (f", {static['accelerator']}" if static.get("accelerator") else "")


def render(rec: dict, fig: dict, opts: str = "") -> str:
  """A figure's text on a page: `text` where the record keeps one (a legacy figure as the page wrote it),
  else its value (a number, or [low, high] for a range) and unit, as `opts` say."""
  words = opts.split()
  meta = rec["record"]
  if "machine" in words:
    return machine_name(rec)
  if "commit" in words:
    return f"`{meta.get('commit')}`"
  if "date" in words:
    return str(meta.get("date") or "unknown")[:10]
  if "load" in words:
    if meta.get("kind") == "compile":
      return "a compile analysis: any load"
    if not meta.get("load_before") and not meta.get("load_after"):
      return "not recorded"
    before, after = [(x or ["?"])[0] for x in (meta.get("load_before"), meta.get("load_after"))]
    before, after = [round(x, 2) if isinstance(x, float) else x for x in (before, after)]
    return f"load average {before} before, {after} after"
  for how in ("peak", "floor"):
    if how in words:
      return portable(rec, fig, how)
  if "text" in fig and not any(w not in ("bare", "k") for w in words):
    text, unit = fig["text"], fig["unit"]
    return text[:-len(unit)].rstrip() if "bare" in words and unit and text.endswith(unit) else text
  if "minsec" in words and fig["unit"] == "s":  # 791 s -> "13 min 11 s"
    minutes, seconds = divmod(round(fig["value"]), 60)
    return f"{seconds} s" if not minutes else f"{minutes} min" + (f" {seconds} s" if seconds else "")
  spec = next((w for w in words if w not in ("bare", "k", "GB", "MB")), None)
  value, unit = fig["value"], fig["unit"]
  for scale, factor in (("GB", 1e9), ("MB", 1e6)):  # a figure in bytes shown in GB / MB
    if scale in words:
      value, unit = value / factor, scale
  text = "-".join(number(v, spec) for v in value) if isinstance(value, list) else number(value, spec)
  if "k" in words:  # 651,757 -> 652k
    text = f"{round(value / 1e3):,}k"
  if "bare" in words or not unit:
    return text
  return text + (unit if unit in ("x", "%") else " " + unit)


def stale_note(s: dict) -> str:
  since = "a commit this clone lacks" if s["since"] is None else f"{s['since']} commits of its code since"
  return f"(measured at `{s['commit']}`, {since})"


_HEAD = re.compile(r"(?P<open><!--fig:|\{)(?P<id>[^\s>{}:]+:[^\s>{}]+)(?P<opts>[^>{}]*?)(?P<close>-->|\})")


def retaken(store: dict, fid: str, opts: str) -> tuple[str, str] | None:
  """(figure id, options) of the record that retakes a legacy figure, where the store holds it: the legacy
  figure's `retake` ({"figure": RECORD:KEY, "opts": options}, written where the benchmark that retakes it is
  known: benchmarks/run_all.sh's line); None where it has none or its record is not yet measured. The span's
  own options stay (`bare`, `k`, `commit`, ...), its number format replaced by `opts` where the retake has them."""
  rid, _, key = fid.partition(":")
  target = ((store.get(rid) or {}).get("figures", {}).get(key) or {}).get("retake")
  if not target:
    return None
  new_rid, _, new_key = target["figure"].partition(":")
  if new_key not in (store.get(new_rid) or {}).get("figures", {}):
    return None
  words = opts.split()
  if "opts" in target:  # the new figure's own number format (a share as `.2%`, bytes as `GB`) replaces the span's
    words = target["opts"].split() + [w for w in words if not re.match(r"[.+\d]", w) and w not in ("GB", "MB")]
  return target["figure"], " ".join(words)


def switch_retaken(text: str, store: dict) -> str:
  """`text` with each span and table placeholder of a legacy figure that a sweep has retaken naming the new
  figure instead (`retaken`): once its record exists, the page shows the new measurement, not the old."""
  def sub(m: re.Match) -> str:
    new = retaken(store, m.group("id"), m.group("opts"))
    if new is None:
      return m.group(0)
    return f"{m.group('open')}{new[0]}{' ' + new[1] if new[1] else ''}{m.group('close')}"
  return _HEAD.sub(sub, text)


def _render_spans(line: str, store: dict, errors: list[str], where: str) -> str:
  def sub(m: re.Match) -> str:
    try:
      rec, fig = lookup(store, m.group("id"))
    except KeyError as e:
      errors.append(f"{where}: {e.args[0]}")
      return m.group(0)
    return f"<!--fig:{m.group('id')}{m.group('opts')}-->{render(rec, fig, m.group('opts'))}<!--/fig-->"
  return SPAN.sub(sub, line)


def _note(rid: str, s: dict) -> str:
  return f"<!--stale:{rid}-->{stale_note(s)}<!--/stale-->"


def _blocks(lines: list[str]) -> list[list[int]]:
  """Line indices of each block: a paragraph, a list item's lines or a table (blank lines and headings part them)."""
  blocks, current = [], []
  for i, line in enumerate(lines):
    starts = not line.strip() or line.startswith("#") or line.lstrip().startswith(("- ", "* "))
    if starts and current:
      blocks.append(current)
      current = []
    if line.strip() and not line.startswith("#"):
      current.append(i)
  return blocks + ([current] if current else [])


_NOTE_LINE = re.compile(r"The figures of `[^`]+` above:")


def _strip_notes(lines: list[str]) -> list[str]:
  """The lines without stale notes: a note line under a table goes with the blank line before it."""
  out: list[str] = []
  for line in lines:
    if _NOTE_LINE.fullmatch(STALE.sub("", line)) and STALE.search(line):
      if out and not out[-1].strip():
        out.pop()
      continue
    out.append(STALE.sub("", line))
  return out


def rewrite(text: str, store: dict, stale: dict, where: str = "", errors: list[str] | None = None) -> str:
  """`text` with every span's figure from `store` and a stale note per block (paragraph, list item, table) for
  each stale record it shows: after the record's last span in prose, on a line of its own under a table."""
  errors = [] if errors is None else errors
  lines = _strip_notes(text.split("\n"))
  lines = [_render_spans(line, store, errors, f"{where}:{i + 1}") for i, line in enumerate(lines)]
  under: dict[int, list[str]] = {}  # last line of a table -> note lines to put below it
  incode = False
  code = set()
  for i, line in enumerate(lines):
    if line.lstrip().startswith("```"):
      incode = not incode
    if incode or line.lstrip().startswith("```"):
      code.add(i)
  for block in _blocks(lines):
    block = [i for i in block if i not in code]
    last: dict[str, tuple[int, int]] = {}  # record id -> (line, end of its last span there)
    for i in block:
      for m in SPAN.finditer(lines[i]):
        last[m.group("id").partition(":")[0]] = (i, m.end())
    table = bool(block) and lines[block[0]].lstrip().startswith("|")
    for rid, (i, end) in sorted(last.items(), key=lambda kv: (-kv[1][0], -kv[1][1])):
      if rid not in stale:
        continue
      if table:
        under.setdefault(block[-1], []).insert(0, f"The figures of `{rid}` above: {_note(rid, stale[rid])}")
      else:
        lines[i] = lines[i][:end] + " " + _note(rid, stale[rid]) + lines[i][end:]
  out = []
  for i, line in enumerate(lines):
    out.append(line)
    for note in under.get(i, []):
      out += ["", note]
  return "\n".join(out)


def spans(text: str) -> list[tuple[str, str]]:
  """(figure id, text) of every span of a page."""
  return [(m.group("id"), m.group("text")) for m in SPAN.finditer(text)]


def shown(repo: str = record.REPO) -> dict[str, list[str]]:
  """{figure id: [pages showing it]} over README.md and docs/*.md."""
  out: dict[str, list[str]] = {}
  for path in pages(repo):
    with open(path, encoding="utf-8") as f:
      for fid, _ in spans(f.read()):
        out.setdefault(fid, [])
        rel = os.path.relpath(path, repo)
        if rel not in out[fid]:
          out[fid].append(rel)
  return out


def anchor(fid: str) -> str:
  """The id of a figure's row on docs/figures.md."""
  return "fig-" + re.sub(r"[^a-z0-9]+", "-", fid.lower()).strip("-")


def _load(meta: dict) -> str:
  def fmt(load: Any) -> str:
    return f"{load[0]:.2f}" if isinstance(load, list) and load else "?"
  return f"{fmt(meta.get('load_before'))} / {fmt(meta.get('load_after'))}"


def _machine_heading(machine: dict) -> list[str]:
  static, measured = machine.get("static") or {}, machine.get("measured") or {}
  fp = machine.get("fingerprint", record.UNKNOWN)
  lines = [f"## Machine `{fp}`" if fp != record.UNKNOWN else "## Machines before the store", ""]
  if static and fp != record.UNKNOWN:
    isa = ", ".join(static.get("isa") or []) or "none named"
    lines.append(f"{static.get('cpu_model')} ({static.get('cpu_family')}), ISA {isa}, {static.get('cores')} cores, "
                 f"{static.get('memory_gib')} GiB" + (f", {static['accelerator']}" if static.get("accelerator") else "")
                 + ".")
  if static.get("compiled_for"):
    lines.append(f"Compiled for `{static['compiled_for']}` on the CPU above, without the chips (XLA's own compiler for "
                 "them): bytes, FLOPs and bounds, not timings, so the load does not move them.")
  if measured:
    lines.append(f"Measured in the run: matmul peak {measured.get('matmul_peak_flops', 0) / 1e9:.0f} GFLOP/s, "
                 f"memory bandwidth {measured.get('memory_bandwidth_bytes_per_s', 0) / 1e9:.1f} GB/s.")
  if fp == record.UNKNOWN:
    lines.append("Records of measurements taken before the store: the machine is the one the record's `machine` "
                 "names (the page's CPU-A, -B, -C), its fingerprint unknown.")
  return lines + [""]


def _cell(text: Any) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ")


def _figure_rows(rid: str, data: dict, on_pages: dict[str, list[str]], stale: dict) -> list[str]:
  meta = data["record"]
  name = (meta.get("machine") or {}).get("name")
  rows = []
  for key, fig in sorted(data["figures"].items()):
    fid = f"{rid}:{key}"
    if fid not in on_pages:
      continue
    note = f" {stale_note(stale[rid])}" if rid in stale else ""
    value = render(data, fig)
    for how, field in (("peak", "flops"), ("floor", "floor")):
      if field in fig:
        value += f" ({portable(data, fig, how)})"
    cells = [f'<a id="{anchor(fid)}"></a>`{rid}`', f"`{key}`", _cell(value), f"`{_cell(fig.get('command') or meta.get('command', ''))}`",
             f"`{meta.get('commit')}`{note}", str(meta.get("date", ""))[:10], _load(meta), _cell(fig.get("machine") or name or ""),
             ", ".join(on_pages[fid])]
    rows.append("| " + " | ".join(cells) + " |")
  return rows


AS_OF = re.compile(r"Stale notes count the commits up to `(\w+)`")


def pages_as_of(repo: str = record.REPO) -> str:
  """The commit the pages' stale notes count up to (docs/figures.md names it); HEAD where it names none."""
  path = os.path.join(repo, GENERATED)
  m = AS_OF.search(open(path, encoding="utf-8").read()) if os.path.exists(path) else None
  return m.group(1) if m else "HEAD"


def figures_page(store: dict, on_pages: dict[str, list[str]], stale: dict, as_of: str) -> str:
  """docs/figures.md: one table per machine fingerprint of every figure a page shows."""
  groups: dict[str, list[str]] = {}
  machines: dict[str, dict] = {}
  for rid, data in sorted(store.items()):
    machine = data["record"].get("machine") or {"fingerprint": record.UNKNOWN}
    fp = machine.get("fingerprint", record.UNKNOWN)
    machines.setdefault(fp, machine)
    groups.setdefault(fp, []).extend(_figure_rows(rid, data, on_pages, stale))
  out = ["# Measured figures", "",
         "Every measured figure of these pages and the README, generated from the results store (`results/`: one "
         "JSON record per measurement, written by `benchmarks/record.py`) by `python benchmarks/figures.py "
         "--write`; do not edit by hand. One table per machine fingerprint (the CPU, its ISA flags, cores and "
         "memory; the matmul peak and memory bandwidth measured in the run). `bash benchmarks/run_all.sh` "
         "measures them all again; `python benchmarks/stale.py` lists the records whose code changed since "
         "their commit (the note after a commit).", "",
         f"Stale notes count the commits up to `{as_of}`, the commit `figures.py --write` last ran on.", ""]
  header = ["| record | figure | value | command | commit | date | load before / after | machine | shown on |",
            "|---|---|---|---|---|---|---|---|---|"]
  for fp in sorted(groups, key=lambda f: (f == record.UNKNOWN, f)):
    if groups[fp]:
      out += _machine_heading(machines[fp]) + header + groups[fp] + [""]
  return "\n".join(out)


def run(repo: str = record.REPO, write: bool = False, as_of: str | None = None) -> list[str]:
  """The pages' differences from the store (write=False) or the pages rewritten (write=True): the problems
  left, one line each (a span naming a figure the store lacks; with write=False a span or page that differs)."""
  store = record.read_store(os.path.join(repo, "results"))
  as_of = as_of or (record.git_commit(repo)[0] if write else pages_as_of(repo))
  stale = stale_lib.stale_records(store, repo, as_of if as_of != "unknown" else "HEAD")
  problems: list[str] = []
  for path in pages(repo):
    rel = os.path.relpath(path, repo)
    with open(path, encoding="utf-8") as f:
      text = f.read()
    new = rewrite(page_tables.expand(switch_retaken(text, store), store, rel, problems), store, stale, rel, problems)
    if new != text:
      if write:
        _atomic_write(path, new)
      else:
        old = dict(spans(text))
        for fid, shown_text in spans(new):
          if old.get(fid) != shown_text:
            problems.append(f"{rel}: {fid} shows {old.get(fid)!r}, the store {shown_text!r}")
        problems.append(f"{rel}: differs from the store (python benchmarks/figures.py --write)")
  page = figures_page(store, shown(repo), stale, as_of) + "\n"
  target = os.path.join(repo, GENERATED)
  current = open(target, encoding="utf-8").read() if os.path.exists(target) else ""
  if page != current:
    if write:
      _atomic_write(target, page)
    else:
      problems.append(f"{GENERATED}: differs from the store (python benchmarks/figures.py --write)")
  return problems


def _atomic_write(path: str, text: str) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
  mode = parser.add_mutually_exclusive_group(required=True)
  mode.add_argument("--write", action="store_true", help="rewrite the spans and docs/figures.md from the store")
  mode.add_argument("--check", action="store_true", help="exit 1 where a span or page differs from the store")
  parser.add_argument("--repo", default=record.REPO, help="the clone whose pages and results/ to read")
  parser.add_argument("--as_of", default=None, help="with --write: count the stale notes up to this commit "
                      "(default HEAD; a branch keeps its base's so pages it does not change stay as they are)")
  args = parser.parse_args(argv)
  problems = run(args.repo, write=args.write, as_of=args.as_of)
  for p in problems:
    print(p, file=sys.stderr)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
