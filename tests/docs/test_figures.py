"""Every measured figure of README.md and docs/ comes from the results store (results/, benchmarks/record.py):
each sits in a span that `python benchmarks/figures.py --write` renders from its record, the spans equal the
store, a changed record changes every span that shows it, and the stale notes are what benchmarks/stale.py
lists."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys

from paths import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import figures  # pylint: disable=g-import-not-at-top,wrong-import-position
import page_tables  # pylint: disable=g-import-not-at-top,wrong-import-position
import record  # pylint: disable=g-import-not-at-top,wrong-import-position
import stale  # pylint: disable=g-import-not-at-top,wrong-import-position

# Text that is not prose: inline code, HTML comments and tags, link targets.
_NOT_PROSE = re.compile(r"`[^`]*`|<!--.*?-->|<[^>]+>|\]\([^)]*\)")


def _pages() -> dict[str, str]:
  out = {}
  for path in figures.pages(REPO_ROOT):
    with open(path, encoding="utf-8") as f:
      out[os.path.relpath(path, REPO_ROOT)] = f.read()
  return out


def unspanned(text: str) -> list[tuple[int, str]]:
  """(line, figure) of each measured figure of a page outside a span, a code block, a fact line and a table
  spec (`<!--rows ... -->`, benchmarks/page_tables.py: its cells are spans once written)."""
  out, code, spec = [], False, page_tables.spec_lines(text)
  for i, line in enumerate(text.split("\n"), 1):
    if line.lstrip().startswith("```"):
      code = not code
      continue
    if code or figures.FACT in line or i in spec:
      continue
    prose = _NOT_PROSE.sub(" ", figures.STALE.sub(" ", figures.SPAN.sub(" ", line)))
    out += [(i, m.group(0)) for m in figures.MEASURED.finditer(prose)]
  return out


def test_spans_equal_the_store():
  assert figures.run(REPO_ROOT, write=False) == []


def test_no_measured_figure_outside_a_span():
  found = {page: unspanned(text) for page, text in _pages().items()}
  found = {page: hits for page, hits in found.items() if hits}
  assert not found, f"measured figures outside a span (or mark the line {figures.FACT}): {found}"


def test_no_line_starts_with_a_span():
  """A line that opens with `<!--` starts an HTML block (CommonMark, a forge): its paragraph would break there."""
  starts = [(page, i) for page, text in _pages().items() for i, line in enumerate(text.split("\n"), 1)
            if re.match(r"\s*<!--(fig|stale)", line)]
  assert not starts, starts


def test_the_pattern_finds_figures_and_not_facts():
  assert [m.group(0) for m in figures.MEASURED.finditer("p50 14.9 ms, 0.84x, 1.67-1.74x, 20,866 tokens/s, "
                                                         "3.4 GB, 5-6 minutes")] == \
      ["14.9 ms", "0.84x", "1.67-1.74x", "20,866 tokens/s", "3.4 GB", "5-6 minutes"]
  assert not figures.MEASURED.search("32 x 20 tokens, `h200:1x1x8`, 2x2, 1e-6, 512 steps, 8 devices")
  assert unspanned("a <!--fig:a:b-->14.9 ms<!--/fig--> call\nbuckets of 64 ms <!--fact-->\n```\n3 s\n```") == []


def test_a_changed_record_changes_every_span_showing_it(tmp_path):
  for name in ("README.md", "docs", "results"):
    copy = shutil.copytree if os.path.isdir(os.path.join(REPO_ROOT, name)) else shutil.copy
    copy(os.path.join(REPO_ROOT, name), tmp_path / name)
  fid = "serving/serve_load_small:serve.levels.2.over_direct"
  before = {p: figures.spans((tmp_path / p).read_text()) for p in ("README.md", "docs/performance.md")}
  assert all(any(f == fid for f, _ in s) for s in before.values())
  path = tmp_path / "results" / "serving" / "serve_load_small.json"
  data = json.loads(path.read_text())
  data["figures"]["serve.levels.2.over_direct"]["value"] = 1.23
  path.write_text(json.dumps(data))
  assert figures.run(str(tmp_path), write=True) == []
  for page, old in before.items():
    new = figures.spans((tmp_path / page).read_text())
    assert [f for f, _ in new] == [f for f, _ in old]
    for (f, text), (_, was) in zip(new, old):
      assert text == ("1.2x" if f == fid else was), (page, f)
  assert figures.run(str(tmp_path), write=False) == []


def test_no_figure_shows_two_values():
  texts: dict[tuple[str, str], set[str]] = {}
  for text in _pages().values():
    for m in figures.SPAN.finditer(text):
      texts.setdefault((m.group("id"), m.group("opts")), set()).add(m.group("text"))
  assert not {k: v for k, v in texts.items() if len(v) > 1}


def test_stale_notes_are_what_stale_lists():
  store = record.read_store(os.path.join(REPO_ROOT, "results"))
  # the pages count up to the commit their last `--write` ran on (docs/figures.md names it); stale.py: HEAD
  listed = stale.stale_records(store, REPO_ROOT, figures.pages_as_of(REPO_ROOT))
  pages = _pages()
  shown = {fid.partition(":")[0] for text in pages.values() for fid, _ in figures.spans(text)}
  said = {}
  for text in pages.values():
    for m in figures.STALE.finditer(text):
      said[m.group("rid")] = re.search(r"measured at `(\w+)`", m.group(0)).group(1)
  assert set(said) == set(listed) & shown, "run python benchmarks/figures.py --write"
  assert all(said[rid] == listed[rid]["commit"] for rid in said)
  assert stale.main([]) == 0


def test_a_record_has_its_machine_commit_and_load(tmp_path):
  results = tmp_path / "results"
  path = record.write_record(str(results / "x" / "y.json"), {"p50_ms": {"value": 1.5, "unit": "ms"}}, "cmd",
                             ["elmo_jax"], payload={"a": 1}, machine={"fingerprint": "abc"}, root=str(results))
  assert path["record"]["id"] == "x/y" and path["a"] == 1 and path["record"]["commit"]
  assert record.read_store(str(results))["x/y"]["figures"]["p50_ms"]["value"] == 1.5
  static = record.static_machine()
  assert static["cores"] and record.fingerprint_id(static) == record.fingerprint_id(dict(static))
  assert record.unit_of("batch_1.ms.p50") == "ms" and record.unit_of("onnx.p50_over_embedder") == "x"


def test_a_rows_spec_gives_one_table_per_machine():
  def rec(fp, value):
    machine = {"fingerprint": fp, "static": {"cpu_model": f"CPU {fp}", "cores": 2}}
    return {"record": {"command": f"python b_{fp}.py", "commit": "abc1234", "date": "2026-01-02T00:00:00Z",
                       "load_before": [0.5], "load_after": [0.7], "machine": machine},
            "figures": {"p50_ms": {"value": value, "unit": "ms"}, "ratio": {"value": 0.5, "unit": "x"}}}
  store = {"a/x": rec("f1", 1.5), "a/y": rec("f2", 2.5)}
  spec = "| what | p50 |\n| x | {a/x:p50_ms} ({a/x:ratio .2f}) |\n| y | {a/y:p50_ms} |"
  errors: list[str] = []
  page = figures.rewrite(page_tables.expand(f"<!--rows\n{spec}\n-->\n<!--/rows-->\n", store, "p", errors), store, {})
  assert errors == []
  assert page.count("| what | p50 | command | commit | date | load before / after |") == 2  # one per machine
  assert "On CPU f1, 2 cores (fingerprint [`f1`]" in page and "On CPU f2, 2 cores" in page
  assert "| x | <!--fig:a/x:p50_ms-->1.50 ms<!--/fig--> (<!--fig:a/x:ratio .2f-->0.50x<!--/fig-->) | `python b_f1.py` |" in page
  assert page == figures.rewrite(page_tables.expand(page, store, "p", errors), store, {})  # written once
  page_tables.expand("<!--rows\n| what | p50 |\n| x | {a/x:p50_ms} vs {a/y:p50_ms} |\n-->\n<!--/rows-->", store,
                     "p", errors)
  assert errors and "one record" in errors[0]  # a ratio is never formed from two runs


def test_a_retaken_legacy_figure_switches_once_its_record_exists():
  legacy = {"record": {"machine": {"fingerprint": record.UNKNOWN}},
            "figures": {"k": {"value": 0.83, "unit": "%", "text": "0.83%",
                              "retake": {"figure": "pipeline/x:share", "opts": ".2%"}}}}
  text = "waits <!--fig:legacy/a:k .2f-->0.83%<!--/fig--> | {legacy/a:k .2f} | {legacy/a:k commit} |"
  assert figures.switch_retaken(text, {"legacy/a": legacy}) == text  # not yet measured: the legacy span stays
  new = {"record": {"commit": "abc1234"}, "figures": {"share": {"value": 0.0034, "unit": ""}}}
  assert figures.switch_retaken(text, {"legacy/a": legacy, "pipeline/x": new}) == (
      "waits <!--fig:pipeline/x:share .2%-->0.83%<!--/fig--> | {pipeline/x:share .2%} | {pipeline/x:share .2% commit} |")
