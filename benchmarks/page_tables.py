"""Tables of a page generated from the results store: one table per machine, each row's command, commit and date.

A page declares a table's columns and rows in a comment and `python benchmarks/figures.py --write` writes the
tables after it, up to `<!--/rows-->` (do not edit between; docs/performance.md is made of them):

    <!--rows
    | what | figure | on any machine |
    | the `small` train step | {training/train_throughput_small:train.small.tokens_per_s} | {training/...:... peak} |
    -->
    <!--/rows-->

A cell's `{RECORD:KEY opts}` is a figure (a span of benchmarks/figures.py, with its options: `.2f`, `bare`,
`peak`, `floor`, ...). Every figure of a row comes from one record (a ratio is never formed from two runs); the
rows are grouped by the machine their record was measured on (its fingerprint; a record from before the store by
the machine its page named), one table each, the machines with a fingerprint first, in the order the spec
names them, each table's rows in the spec's order. Each table's columns are the spec's and the row's command, commit, date and load average before and
after, taken from its record.
"""
from __future__ import annotations

import re

import record

BLOCK = re.compile(r"(?P<head><!--rows\n(?P<spec>.*?)\n-->\n)(?P<body>.*?)(?P<tail><!--/rows-->)", re.S)
PLACEHOLDER = re.compile(r"\{(?P<id>[^\s{}:]+:[^\s{}]+)(?P<opts>[^{}]*)\}")
TAIL = ("command", "commit", "date", "load before / after")


def _cells(line: str) -> list[str]:
  """The cells of a `| a | b |` line (a `\\|` stays in its cell)."""
  parts = re.split(r"(?<!\\)\|", line.strip())
  return [p.strip() for p in parts[1:-1]]


def _machine(data: dict, fig: dict) -> tuple[tuple[int, str], str]:
  """(sort key, caption) of the machine a figure was measured on: its fingerprint's, else the name its page gave."""
  machine = data["record"].get("machine") or {}
  fp = machine.get("fingerprint", record.UNKNOWN)
  if fp != record.UNKNOWN:
    import figures  # pylint: disable=g-import-not-at-top,import-outside-toplevel  (figures imports this module)
    what = ("the CPU and the target; a compile analysis, not a timing" if machine.get("static", {}).get("compiled_for")
            else "its CPU, ISA flags, memory and the matmul peak and memory bandwidth measured in the run")
    return (0, fp), f"On {figures.machine_name(data)} (fingerprint [`{fp}`](figures.md#machine-{fp}): {what}):"
  name = fig.get("machine") or machine.get("name") or "an unknown machine"
  label, _, words = name.partition(":")
  what = f"**{label}**" + (f", {words.strip()}" if words else "")
  return (1, label), (f"On {what}, measured before the store (its fingerprint unknown: "  # its memory: a fact
                      "[the machines before the store](figures.md#machines-before-the-store)): <!--fact-->")


def _row(cells: list[str], store: dict, where: str, errors: list[str]) -> tuple[tuple, str, str] | None:
  """(machine key, caption, the table line) of one spec row; None (and an error) where it cannot be drawn."""
  ids = [m.group("id") for c in cells for m in PLACEHOLDER.finditer(c)]
  rids = sorted({fid.partition(":")[0] for fid in ids})
  if len(rids) != 1:
    errors.append(f"{where}: a row's figures come from one record, not {rids or 'none'}: {' | '.join(cells)}")
    return None
  rid = rids[0]
  if rid not in store or any(fid.partition(":")[2] not in store[rid]["figures"] for fid in ids):
    missing = next(fid for fid in ids if rid not in store or fid.partition(":")[2] not in store[rid]["figures"])
    errors.append(f"{where}: figure {missing!r}: not in the store (results/{rid}.json)")
    return None
  data, first = store[rid], ids[0]
  fig = data["figures"][first.partition(":")[2]]
  command = str(fig.get("command") or data["record"].get("command", "")).replace("|", "\\|")
  spans = [PLACEHOLDER.sub(lambda m: f"<!--fig:{m.group('id')}{m.group('opts')}--><!--/fig-->", c) for c in cells]
  spans += [f"`{command}`", f"<!--fig:{first} commit--><!--/fig-->", f"<!--fig:{first} date--><!--/fig-->",
            f"<!--fig:{first} load--><!--/fig-->"]
  key, caption = _machine(data, fig)
  return key, caption, "| " + " | ".join(spans) + " |"


def tables(spec: str, store: dict, where: str = "", errors: list[str] | None = None) -> str:
  """The tables of one spec (its header line, then its rows), one per machine, spans left empty for
  benchmarks/figures.py to fill."""
  errors = [] if errors is None else errors
  lines = [line for line in spec.split("\n") if line.strip().startswith("|")]
  if not lines:
    errors.append(f"{where}: a <!--rows spec needs a header line `| a | b |` and rows")
    return ""
  header = _cells(lines[0]) + list(TAIL)
  groups: dict[tuple, tuple[str, list[str]]] = {}
  for line in lines[1:]:
    if re.fullmatch(r"\|[\s:|-]*\|", line.strip()):  # a `|---|---|` line
      continue
    row = _row(_cells(line), store, where, errors)
    if row:
      key, caption, text = row
      groups.setdefault(key, (caption, []))[1].append(text)
  out = []
  for key in sorted(groups, key=lambda k: k[0]):  # measured machines first, each in the order the spec meets it
    caption, rows = groups[key]
    out += ["", caption, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows]
  return "\n".join(out + ["", ""])


def expand(text: str, store: dict, where: str = "", errors: list[str] | None = None) -> str:
  """`text` with each `<!--rows ... -->` spec's tables written after it, up to its `<!--/rows-->`."""
  def sub(m: re.Match) -> str:
    line = text.count("\n", 0, m.start()) + 1
    return m.group("head") + tables(m.group("spec"), store, f"{where}:{line}", errors) + m.group("tail")
  return BLOCK.sub(sub, text)


def spec_lines(text: str) -> set[int]:
  """1-based numbers of the lines of a page that belong to a `<!--rows` spec (not prose)."""
  out: set[int] = set()
  for m in BLOCK.finditer(text):
    first = text.count("\n", 0, m.start()) + 1
    out.update(range(first, first + m.group("head").count("\n")))
  return out
