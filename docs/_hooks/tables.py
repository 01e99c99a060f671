"""Commands in table cells wrap at their spaces only: an mkdocs hook (`hooks:` in mkdocs.yml).

A browser may break a line after any hyphen, so in a narrow column `elmo-jax train --config=configs/default.py`
read `elmo-jax train --` / `config=configs/default.py`, and no CSS property turns that off short of `nowrap`.
Each space-separated word of a table cell's inline code goes in a `<span class="nowrap">`, which
docs/stylesheets/extra.css keeps whole; the text, and so a copied command, is unchanged.
"""
from __future__ import annotations

import re

_CELL = re.compile(r"<td\b[^>]*>.*?</td>", re.S)
_CODE = re.compile(r"<code>([^<]*)</code>")  # plain inline code: escaped text, no markup inside


def _words(match: re.Match) -> str:
  return "<code>" + " ".join(f'<span class="nowrap">{w}</span>' if w else w
                             for w in match.group(1).split(" ")) + "</code>"


def keep_words(html: str) -> str:
  """`html` with the inline code of every table cell split into unbreakable words."""
  return _CELL.sub(lambda cell: _CODE.sub(_words, cell.group(0)), html)


def on_page_content(html, page, config, files):  # mkdocs hook; pylint: disable=unused-argument
  return keep_words(html)
