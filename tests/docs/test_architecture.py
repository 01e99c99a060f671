"""ARCHITECTURE.md's rules, read off the source: no import cycle between modules of `elmo_jax` (imports placed
inside functions count too), `runtime` imports nothing above it, and only entry points import `cli`."""
from __future__ import annotations

import ast
import os

from paths import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "elmo_jax")


def _module(path: str) -> str:
  name = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
  return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
  """module -> the `elmo_jax` modules it imports anywhere in its file (top level, functions, TYPE_CHECKING)."""
  paths = {_module(os.path.join(d, f)): os.path.join(d, f)
           for d, _, names in os.walk(PACKAGE) for f in names if f.endswith(".py")}
  graph = {}
  for module, path in paths.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    named = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        named.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        named.add(node.module)
        named.update(f"{node.module}.{a.name}" for a in node.names)  # `from pkg import module`
      assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}: relative import"
    graph[module] = {m for m in named if m in paths and m != module}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_cycle_finder_finds_a_circle_through_a_function_import():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
  graph = import_graph()
  assert "elmo_jax.runtime.storage" in graph and "elmo_jax.runtime.files" in graph["elmo_jax.runtime.storage"]
  assert cycles(graph) == []


def _room(module: str) -> str:
  return module.split(".")[1] if "." in module else ""


def test_runtime_imports_nothing_above_it():
  upward = {m: sorted(d for d in deps if _room(d) != "runtime")
            for m, deps in import_graph().items() if _room(m) == "runtime"}
  assert {m: d for m, d in upward.items() if d} == {}


def test_only_entry_points_import_the_commands():
  entry = {m for m in import_graph() if m.endswith(".__main__") or m == "elmo_jax.embed"}
  importers = {m for m, deps in import_graph().items() if _room(m) != "cli" and any(_room(d) == "cli" for d in deps)}
  assert importers and importers <= entry, importers - entry
