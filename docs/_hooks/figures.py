"""Measured figures link to their record: an mkdocs hook (`hooks:` in mkdocs.yml).

Each `<!--fig:RECORD:KEY-->14.9 ms<!--/fig-->` span of a page (rewritten from the results store by
`python benchmarks/figures.py --write`) becomes a link to the figure's row on the Measured figures page
(docs/figures.md), titled with its record's machine, commit and date; the build prints the stale records
(`python benchmarks/stale.py`), whose figures the pages mark "measured at ..., N commits of its code since".
"""
from __future__ import annotations

import logging
import os
import sys

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "benchmarks")
sys.path.insert(0, _BENCHMARKS)
import figures  # pylint: disable=g-import-not-at-top,wrong-import-position
import record  # pylint: disable=g-import-not-at-top,wrong-import-position
import stale  # pylint: disable=g-import-not-at-top,wrong-import-position

log = logging.getLogger("mkdocs.hooks.figures")
_STORE: dict = {}


def linked(markdown: str, store: dict, prefix: str = "") -> str:
  """`markdown` with each span's text a link to its row on figures.md (`prefix` leads there from the page)."""
  def link(m) -> str:
    rid = m.group("id").partition(":")[0]
    meta = store[rid]["record"] if rid in store else {}
    machine = (meta.get("machine") or {}).get("name") or (meta.get("machine") or {}).get("fingerprint", "")
    title = f"{rid}: {machine}, commit {meta.get('commit')}, {str(meta.get('date', ''))[:10]}".replace('"', "'")
    return f'[{m.group("text")}]({prefix}figures.md#{figures.anchor(m.group("id"))} "{title}")'
  return figures.SPAN.sub(link, markdown)


def on_pre_build(config):  # mkdocs hook; pylint: disable=unused-argument
  _STORE.clear()
  _STORE.update(record.read_store())
  for rid, s in stale.stale_records(_STORE).items():
    log.info("stale figures: %s %s (%d figures)", rid, figures.stale_note(s), len(s["figures"]))


def on_page_markdown(markdown, page, config, files):  # mkdocs hook; pylint: disable=unused-argument
  if page.file.src_uri == "figures.md":
    return markdown
  return linked(markdown, _STORE, "../" * page.file.src_uri.count("/"))
