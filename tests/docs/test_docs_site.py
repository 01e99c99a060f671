"""The README is a front door (at most 200 lines, the two commands first) and the docs site builds with
`mkdocs build --strict` (broken links and anchors fail); neither holds measurement history (that is
CHANGELOG.md's; the performance page pins each figure to its commit)."""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest
from paths import REPO_ROOT

README = os.path.join(REPO_ROOT, "README.md")
# Lab notes and figures from a busy machine: what a guide must not hold (history goes to CHANGELOG.md).
HISTORY = re.compile(r"\bthis (round|session)\b|\b(previous|earlier|latest) (round|session|reader|version|step|"
                     r"commit)s?\b|\bbefore / now\b|\bbefore/after\b|\bthe code before\b|\bnot yet\b|"
                     r"\bnot started\b|\bdid not finish\b|\bround \d|\bload averages? (of )?\d\d|\bshared with (six|\d+) other jobs\b|"
                     r"\bA/B script\b", re.I)
# What the notebooks print in place of a figure or table when the run lacks its results.
HOLE = re.compile(r"\bno\b[^\n]{0,40}\b(yet|found)\b|nothing to plot", re.I)
COMMIT = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def test_readme_is_a_front_door():
  lines = _read(README).splitlines()
  assert len(lines) <= 200, len(lines)
  first = "\n".join(lines[:30])
  assert "bash scripts/train.sh" in first and "bash scripts/test.sh" in first
  assert "elmo-jax --help" in _read(README)


def test_readme_links_resolve():
  for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(README)):
    if not re.match(r"https?://", target):
      assert os.path.exists(os.path.join(REPO_ROOT, target)), target


def test_no_history_in_readme_or_docs():
  pages = [README] + sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "**", "*.md"), recursive=True))
  for path in pages:
    text = _read(path)
    assert not HISTORY.search(text), (path, HISTORY.search(text).group(0))
    # performance.md pins figures to commits, figures.md is the store's table; elsewhere a commit is only a
    # stale figure's note ("measured at `abc1234`, N commits of its code since": benchmarks/figures.py).
    if os.path.basename(path) not in ("performance.md", "figures.md"):
      text = re.sub(r"<!--stale:[^>]*-->.*?<!--/stale-->", "", text)
      assert not COMMIT.search(text), (path, COMMIT.search(text).group(0))


def test_history_words_and_commits_are_caught():
  assert HISTORY.search("measured this round") and COMMIT.search("the step of `2477f3f`")
  for note in ("the table is not yet measured", "a Pallas recurrence (not started)", "its compile did not finish",
               "1.67x (round 1: 1.15x)", "at a load average of 13-17", "(earlier step, float32 gates)",
               "against the previous readers", "a 2-core CPU shared with six other jobs"):
    assert HISTORY.search(note), note
  assert not HISTORY.search("row k continues row k of the previous one; the previous good step is used")
  assert not HISTORY.search("nothing else running (load average 1.08 before, 2.11 after)")  # a quiet machine
  assert not COMMIT.search("sha256 1f0c… of deadbeef-free text, 1e-6, 2x1024_128_2048cnn")


@pytest.mark.slow  # ~10 s: mkdocs renders every page
def test_mkdocs_build_strict(tmp_path):
  if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
    pytest.skip("mkdocs / mkdocs-material not installed: pip install -e '.[docs]' (requirements-test.txt pins them)")
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert proc.returncode == 0, proc.stderr[-4000:]
  for page in ("index", "install", "performance", "notebooks/inspect_elmo", "notebooks/downstream_results"):
    assert (tmp_path / "site" / page.removeprefix("index") / "index.html").exists() or page == "index", page
  notebook = _read(str(tmp_path / "site" / "notebooks" / "downstream_results" / "index.html"))
  assert "data:image/png;base64," in notebook  # the executed copy's figures
  # The settings table is rendered (Markdown output), not shown as `| ... |` text in a block.
  assert re.search(r"<table>\s*<thead>\s*<tr>\s*<th>task</th>", notebook) and "| sentiment | frozen |" not in notebook
  for name in ("downstream_results", "inspect_elmo"):
    images = re.findall(r"<img [^>]*>", _read(str(tmp_path / "site" / "notebooks" / name / "index.html")))
    assert images and all('style="max-width:100%"' in i for i in images), name  # scaled to the column
  # Commands in table cells wrap at spaces: the stylesheet is copied and linked, the words kept whole.
  assert "td code" in _read(str(tmp_path / "site" / "stylesheets" / "extra.css"))
  performance = _read(str(tmp_path / "site" / "performance" / "index.html"))
  assert re.search(r'<link[^>]+href="\.\./stylesheets/extra\.css"', performance)
  assert ('<td><code><span class="nowrap">bash</span> <span class="nowrap">scripts/train.sh</span></code></td>'
          in performance)
  reference = _read(str(tmp_path / "site" / "reference" / "index.html"))  # generated from the docstrings
  for anchor in ("embedding.embedder.Embedder.sentence_vectors", "sources.pretrained.load_elmo", "model.elmo.Elmo",
                 "sources.resolve.resolve_model", "sources.loaded.load_model", "training.config.base_config"):
    assert f'id="elmo_jax.{anchor}"' in reference, anchor
  assert "Runs a <code>BiLM</code> over tokenized sentences." in reference  # Embedder's docstring, rendered


def test_executed_notebooks_are_current():
  """Each notebook's page shows the outputs of docs/notebooks/NAME.ipynb: the same code, run without an error
  (`python docs/_hooks/notebooks.py --workdir=RUN` makes them again)."""
  import json  # pylint: disable=g-import-not-at-top
  sources = sorted(glob.glob(os.path.join(REPO_ROOT, "notebooks", "*.ipynb")))
  assert len(sources) == 2
  for source in sources:
    copy = os.path.join(REPO_ROOT, "docs", "notebooks", os.path.basename(source))
    cells = [json.loads(_read(p))["cells"] for p in (source, copy)]
    code = [["".join(c["source"]) for c in cs if c["cell_type"] == "code"] for cs in cells]
    assert code[0] == code[1], f"{copy} is stale: run python docs/_hooks/notebooks.py"
    outputs = [o for c in cells[1] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert outputs and not [o for o in outputs if o["output_type"] == "error"], copy
    assert any("image/png" in o.get("data", {}) for o in outputs), copy
    # A copy made on a run without probes (or results) prints a placeholder where a figure belongs.
    shown = "".join(_text_of(o) for o in outputs)
    assert not HOLE.search(shown), (copy, HOLE.search(shown).group(0))
  inspect = json.loads(_read(os.path.join(REPO_ROOT, "docs", "notebooks", "inspect_elmo.ipynb")))
  images = [o for c in inspect["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
  assert len(images) >= 4, len(images)  # bank + plant heatmaps, the probes' mix weights, perplexity curves


def _text_of(output: dict) -> str:
  data = output.get("data", {})
  return "".join("".join(v) if isinstance(v, list) else v
                 for v in (output.get("text", ""), data.get("text/plain", ""), data.get("text/markdown", "")))


def test_hole_catches_the_placeholders():
  for placeholder in ("No probe results yet: run `elmo-jax evaluate ...`", "no probe results found",
                      "No metrics.jsonl (original weights or an untrained run): nothing to plot.",
                      "no downstream results found", "no perplexity results found"):
    assert HOLE.search(placeholder), placeholder
  assert not HOLE.search("pos: eval/pos.json\nquery: 'the muddy bank of the'\n  layer 0: ...")


def test_notebook_outputs_fit_the_page():
  """The hook's rendering of outputs: a figure is scaled to the column, Markdown (the settings table) passes as
  Markdown, so the page renders a table."""
  hook = _hook("notebooks")
  image = hook._output_markdown({"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo=\n"}})
  assert re.fullmatch(r'<img [^>]*style="max-width:100%"[^>]*src="data:image/png;base64,iVBORw0KGgo=">', image)
  table = "| task | setting |\n|---|---|\n| pos | none |\n"
  shown = {"text/markdown": table, "text/plain": "<IPython.core.display.Markdown object>"}
  assert hook._output_markdown({"output_type": "display_data", "data": shown}) == table


def _hook(name: str):
  spec = importlib.util.spec_from_file_location(f"{name}_hook", os.path.join(REPO_ROOT, "docs", "_hooks", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_table_commands_wrap_at_spaces():
  """docs/performance.md's command column broke inside words ("scripts/train.s h", then "train --" /
  "config=..."): Material's `word-break: break-word` for code, and a browser's break after a hyphen. The extra
  stylesheet and the tables hook, both listed in mkdocs.yml, keep each word of a table cell's code whole."""
  config = _read(os.path.join(REPO_ROOT, "mkdocs.yml"))
  assert re.search(r"^extra_css:\n  - stylesheets/extra\.css\b", config, re.M)
  assert re.search(r"^hooks:\n(  - .*\n)*  - docs/_hooks/tables\.py\n", config, re.M)
  css = _read(os.path.join(REPO_ROOT, "docs", "stylesheets", "extra.css"))
  rule = re.search(r"\.md-typeset td code\s*\{([^}]*)\}", css)
  assert rule and re.search(r"word-break:\s*normal", rule.group(1)) and re.search(r"overflow-wrap:\s*normal",
                                                                                   rule.group(1))
  assert re.search(r"\.md-typeset td code \.nowrap\s*\{\s*white-space:\s*nowrap;", css)
  html = ("<p><code>elmo-jax train</code></p><table><tr><td>a <code>elmo-jax train --config=c.py</code></td>"
          "<td><code>9bf7b22</code></td></tr></table>")
  assert _hook("tables").keep_words(html) == (
      "<p><code>elmo-jax train</code></p><table><tr><td>a <code><span class=\"nowrap\">elmo-jax</span> "
      "<span class=\"nowrap\">train</span> <span class=\"nowrap\">--config=c.py</span></code></td>"
      "<td><code><span class=\"nowrap\">9bf7b22</span></code></td></tr></table>")
