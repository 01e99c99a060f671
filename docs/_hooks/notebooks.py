"""The notebooks as pages of the docs site, with their outputs.

As an mkdocs hook (`hooks:` in mkdocs.yml), `on_files` adds one page per `notebooks/NAME.ipynb`,
`notebooks/NAME.md`: its markdown cells as they are, code cells as Python blocks, and the outputs of the
executed copy `docs/notebooks/NAME.ipynb` (text, tables, PNG figures inlined). The repository's notebooks stay
without outputs; the executed copy is used only while its code cells are the notebook's, else the page shows
the code alone and the build warns (so `mkdocs build --strict` fails until the copy is made again).

As a script it makes the executed copies (needs the `notebook` extra and, for inspect_elmo, a trained run with
probe results, or its scalar-mix section prints a placeholder: docs/testing.md, "The notebooks", has the commands):

    python docs/_hooks/notebooks.py --workdir=runs/default400  # -> docs/notebooks/NAME.ipynb, every notebook
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIR = os.path.join(REPO, "notebooks")
EXECUTED_DIR = os.path.join(REPO, "docs", "notebooks")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
log = logging.getLogger("mkdocs.hooks.notebooks")


def _text(value) -> str:
  return "".join(value) if isinstance(value, list) else str(value)


def _code_sources(nb: dict) -> list[str]:
  return [_text(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _output_markdown(output: dict) -> str:
  """One cell output as markdown: a PNG inlined, markdown as is, else its text in a block."""
  kind = output.get("output_type")
  if kind == "stream":
    return "```text\n" + _ANSI.sub("", _text(output["text"])).rstrip("\n") + "\n```"
  if kind == "error":
    return "```text\n" + _ANSI.sub("", "\n".join(output.get("traceback", []))) + "\n```"
  data = output.get("data", {})
  if "image/png" in data:
    # Figures are drawn at 100 dpi, often wider than the page's column: scaled down to it, never past it.
    return (f'<img alt="output" style="max-width:100%" '
            f'src="data:image/png;base64,{_text(data["image/png"]).strip()}">')
  if "text/markdown" in data:
    return _text(data["text/markdown"])
  if "text/plain" in data:
    return "```text\n" + _text(data["text/plain"]).rstrip("\n") + "\n```"
  return ""


def render(source: dict, executed: dict | None) -> str:
  """The page of one notebook: `executed`'s outputs beside `source`'s cells (None: code only)."""
  outputs = [c.get("outputs", []) for c in executed["cells"] if c["cell_type"] == "code"] if executed else []
  parts, k = [], 0
  for cell in source["cells"]:
    if cell["cell_type"] == "markdown":
      parts.append(_text(cell["source"]))
    elif cell["cell_type"] == "code":
      parts.append("```python\n" + _text(cell["source"]).rstrip("\n") + "\n```")
      parts.extend(m for m in map(_output_markdown, outputs[k] if k < len(outputs) else []) if m)
      k += 1
  return "\n\n".join(parts) + "\n"


def page(name: str) -> str:
  """`notebooks/NAME.ipynb` as markdown, with the executed copy's outputs when it is current."""
  with open(os.path.join(SOURCE_DIR, name + ".ipynb"), encoding="utf-8") as f:
    source = json.load(f)
  executed = None
  copy = os.path.join(EXECUTED_DIR, name + ".ipynb")
  if os.path.exists(copy):
    with open(copy, encoding="utf-8") as f:
      executed = json.load(f)
    if _code_sources(executed) != _code_sources(source):
      executed = None
  if executed is None:
    log.warning("notebooks/%s.ipynb: no current executed copy in docs/notebooks/; the page shows no outputs "
                "(make it: python docs/_hooks/notebooks.py --workdir=RUN)", name)
  note = (f"\n*The outputs are those of `docs/notebooks/{name}.ipynb`, made with "
          "`python docs/_hooks/notebooks.py --workdir=RUN` on a 2-core CPU, RUN trained and probed as in "
          "[Testing](../testing.md#the-notebooks); the model a run used is named in its first output.*\n")
  return render(source, executed) + (note if executed is not None else "")


def names() -> list[str]:
  return sorted(f[:-len(".ipynb")] for f in os.listdir(SOURCE_DIR) if f.endswith(".ipynb"))


def on_files(files, config):  # mkdocs hook
  from mkdocs.structure.files import File  # pylint: disable=g-import-not-at-top
  for name in names():
    files.append(File.generated(config, f"notebooks/{name}.md", content=page(name)))
  return files


def scrub(nb, workdir: str | None = None) -> None:
  """This machine's absolute paths out of the outputs: the clone's (`results folder: ./results/reference`) and
  the run's (`model: runs/NAME`)."""
  pairs = [(REPO + os.sep, "./"), (REPO, ".")]
  if workdir:
    pairs.insert(0, (os.path.abspath(workdir), "runs/" + os.path.basename(os.path.abspath(workdir))))
  for cell in nb["cells"]:
    for output in cell.get("outputs", []):
      for key, holder in (("text", output), ("text/plain", output.get("data", {}))):
        if key in holder:
          text = _text(holder[key])
          for old, new in pairs:
            text = text.replace(old, new)
          holder[key] = text


def execute(workdir: str | None, only: list[str] | None = None) -> None:
  """Runs every notebook in a kernel of this interpreter (as tests/docs/test_notebook.py does) and writes the
  executed copies (temp file, then rename)."""
  import nbclient  # pylint: disable=g-import-not-at-top
  import nbformat  # pylint: disable=g-import-not-at-top
  from ipykernel import kernelspec  # pylint: disable=g-import-not-at-top
  prefix = tempfile.mkdtemp(prefix="elmo-jax-docs-kernel-")
  kernelspec.install(kernel_name="elmo-jax-docs", prefix=prefix)
  os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  if workdir:
    os.environ["ELMO_WORKDIR"] = os.path.abspath(workdir)
  os.makedirs(EXECUTED_DIR, exist_ok=True)
  for name in only or names():
    nb = nbformat.read(os.path.join(SOURCE_DIR, name + ".ipynb"), as_version=4)
    nbclient.NotebookClient(nb, kernel_name="elmo-jax-docs", timeout=600,
                            resources={"metadata": {"path": SOURCE_DIR}}).execute()
    scrub(nb, workdir)
    target = os.path.join(EXECUTED_DIR, name + ".ipynb")
    nbformat.write(nb, target + ".tmp")
    os.replace(target + ".tmp", target)
    print(f"wrote {os.path.relpath(target, REPO)}")


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", help="a trained run for inspect_elmo (ELMO_WORKDIR)")
  parser.add_argument("names", nargs="*", help="notebooks/NAME.ipynb to run (default: all)")
  args = parser.parse_args()
  execute(args.workdir, args.names)
  sys.exit(0)
