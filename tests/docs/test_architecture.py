"""ARCHITECTURE.md's rules, read off the source: the floors it declares hold (a room imports only rooms on lower
floors, imports placed inside functions, under TYPE_CHECKING and anywhere else in a file counting too), no circle
between rooms nor between modules, only entry points import `cli`, no file over 600 lines and no function over
80 (a file holds one concept and is split by concept, not squeezed to a number)."""
from __future__ import annotations

import ast
import os
import re

import pytest

from paths import REPO_ROOT

ARCHITECTURE = os.path.join(REPO_ROOT, "ARCHITECTURE.md")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80
LONGER_FUNCTIONS: dict[tuple[str, str], int] = {}  # (file, function) -> its own limit, where one is argued


def _module(root: str, path: str) -> str:
  return os.path.relpath(path, root)[:-3].replace(os.sep, ".").removesuffix(".__init__")


def _sources(root: str, top: str = "elmo_jax") -> dict[str, str]:
  """module -> path of every .py file under root/top."""
  return {_module(root, os.path.join(d, f)): os.path.join(d, f)
          for d, _, names in os.walk(os.path.join(root, top)) for f in names if f.endswith(".py")}


def import_graph(root: str = REPO_ROOT) -> dict[str, set[str]]:
  """module -> the `elmo_jax` modules it imports anywhere in its file (top level, functions, TYPE_CHECKING)."""
  paths = _sources(root)
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
    graph[module] = {m for m in named if m in paths and m != module and m != "elmo_jax"}
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one node (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
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


def floors(path: str = ARCHITECTURE) -> list[set[str]]:
  """The floors ARCHITECTURE.md declares, lowest first: its line `floors: runtime < data < ... < cli` (rooms on
  one floor separated by commas)."""
  with open(path, encoding="utf-8") as f:
    line = re.search(r"^floors: (.+)$", f.read(), re.M)
  assert line, f"{path}: no line `floors: a < b, c < ...`"
  return [{room.strip() for room in floor.split(",")} for floor in line.group(1).split("<")]


def _room(module: str) -> str:
  """`elmo_jax.<room>.<...>`'s room (a package's own `__init__` is `elmo_jax.<room>`); "" for the package root."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else ""


def is_entry_point(module: str, graph: dict[str, set[str]]) -> bool:  # pylint: disable=unused-argument
  """The commands' one way in inside the package, above every floor: `python -m elmo_jax` (`elmo_jax/__main__.py`)
  and the package root (train.py and evaluate.py sit outside it)."""
  return module in ("elmo_jax", "elmo_jax.__main__")


def test_no_alias_entry_points():
  """One way to start a command: no `__main__` but the package's, no top-level command module (the old
  `python -m elmo_jax.embed`-style aliases are gone)."""
  graph = import_graph()
  assert [m for m in graph if m.endswith("__main__")] == ["elmo_jax.__main__"]
  rooms = set().union(*floors())
  assert [m for m in graph if m.count(".") == 1 and m.split(".")[1] not in rooms] == ["elmo_jax.__main__"]


def room_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, int]]:
  """room -> {room it imports: how many module imports}, entry points left out."""
  rooms: dict[str, dict[str, int]] = {}
  for module, deps in graph.items():
    if is_entry_point(module, graph):
      continue
    out = rooms.setdefault(_room(module), {})
    for dep in deps:
      if _room(dep) != _room(module):
        out[_room(dep)] = out.get(_room(dep), 0) + 1
  return rooms


def floor_violations(graph: dict[str, set[str]], declared: list[set[str]]) -> list[str]:
  """`module -> dep` for each import of a room on the same or a higher floor, and each undeclared room."""
  level = {room: i for i, floor in enumerate(declared) for room in floor}
  bad = []
  for module, deps in sorted(graph.items()):
    if is_entry_point(module, graph):
      continue
    if _room(module) not in level:
      bad.append(f"{module}: room {_room(module)!r} is on no floor")
      continue
    for dep in sorted(deps):
      if _room(dep) != _room(module) and level.get(_room(dep), len(declared)) >= level[_room(module)]:
        bad.append(f"{module} -> {dep}")
  return bad


def test_cycle_finder_finds_a_circle_through_a_function_import():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules():
  graph = import_graph()
  assert "elmo_jax.runtime.storage" in graph and "elmo_jax.runtime.files" in graph["elmo_jax.runtime.storage"]
  assert cycles(graph) == []


def test_every_room_on_its_floor_and_no_circle_between_rooms():
  graph = import_graph()
  declared = floors()
  assert [room for floor in declared for room in floor].count("runtime") == 1
  rooms = room_graph(graph)
  assert set(rooms) == set().union(*declared), "ARCHITECTURE.md's floors name the rooms there are"
  assert floor_violations(graph, declared) == []
  assert cycles({room: set(deps) for room, deps in rooms.items()}) == []


def _plant(tmp_path, files: dict[str, str]) -> str:
  for name, text in files.items():
    path = tmp_path / "elmo_jax" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
  return str(tmp_path)


def test_a_planted_upward_import_inside_a_function_fails(tmp_path):
  """The checker on a copy with one import up a floor inside a function body (and one down, which is fine)."""
  root = _plant(tmp_path, {
      "__init__.py": "", "runtime/__init__.py": "", "cli/__init__.py": "", "data/__init__.py": "",
      "runtime/log.py": "import os\n\ndef info():\n  return os\n",
      "data/vocab.py": "from elmo_jax.runtime import log\n",
      "cli/train.py": "def main():\n  from elmo_jax.data import vocab\n  return vocab\n",
      "runtime/files.py": "def write():\n  if True:\n    from elmo_jax.cli import train  # upward\n  return train\n",
      "cli/__main__.py": "from elmo_jax.cli import train\n"})
  declared = [{"runtime"}, {"data"}, {"cli"}]
  graph = import_graph(root)
  assert floor_violations(graph, declared) == ["elmo_jax.runtime.files -> elmo_jax.cli",
                                               "elmo_jax.runtime.files -> elmo_jax.cli.train"]
  assert cycles({r: set(d) for r, d in room_graph(graph).items()}) == [["cli", "data", "runtime"]]
  os.remove(os.path.join(root, "elmo_jax", "runtime", "files.py"))
  graph = import_graph(root)
  assert floor_violations(graph, declared) == [] and cycles(room_graph(graph)) == []
  assert floor_violations(graph, [{"runtime"}, {"data", "cli"}]) == [  # one floor: neither imports the other
      "elmo_jax.cli.train -> elmo_jax.data", "elmo_jax.cli.train -> elmo_jax.data.vocab"]


def test_runtime_imports_nothing_above_it():
  graph = import_graph()
  upward = {m: sorted(d for d in deps if _room(d) != "runtime") for m, deps in graph.items() if _room(m) == "runtime"}
  assert {m: d for m, d in upward.items() if d} == {}


def test_only_entry_points_import_the_commands():
  graph = import_graph()
  importers = {m for m, deps in graph.items() if _room(m) != "cli" and any(_room(d) == "cli" for d in deps)}
  assert importers and all(is_entry_point(m, graph) for m in importers), importers


def _lines(root: str = REPO_ROOT):
  """(repository-relative path, ast tree, line count) of every .py file outside tests/ (whose file names are
  part of the test ids) and the virtual environment."""
  for d, dirs, names in os.walk(root):
    dirs[:] = sorted(n for n in dirs if not n.startswith(".") and n not in ("tests", "node_modules", "site"))
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(d, name)
        with open(path, encoding="utf-8") as f:
          text = f.read()
        yield os.path.relpath(path, root).replace(os.sep, "/"), ast.parse(text, path), text.count("\n")


def long_functions(root: str = REPO_ROOT) -> dict[tuple[str, str], int]:
  """(path, function) -> its lines, `def` to its last line, for each one over its limit."""
  out = {}
  for rel, tree, _ in _lines(root):
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > LONGER_FUNCTIONS.get((rel, node.name), MAX_FUNCTION_LINES):
          out[(rel, node.name)] = n
  return out


def test_no_function_over_80_lines():
  too_long = long_functions()
  assert too_long == {}


def test_no_file_over_600_lines():
  too_long = {rel: n for rel, _, n in _lines() if n > MAX_FILE_LINES}
  assert too_long == {}


@pytest.mark.parametrize("body, limit", [("  x = 1\n" * 79, None), ("  x = 1\n" * 80, 81)])
def test_the_function_rule_counts_def_to_last_line(tmp_path, body, limit):
  (tmp_path / "m.py").write_text("def f():\n" + body)
  assert long_functions(str(tmp_path)) == ({} if limit is None else {("m.py", "f"): limit})


# --- one resolver: which model a spec means is decided in sources/, what a model file holds read in formats/ ------
MODEL_FORMATS = {f"elmo_jax.formats.{m}" for m in ("options", "weights", "tfhub", "tf_bundle", "efml", "model_folder",
                                                      "safetensors", "torch_pickle", "stablehlo")}
READERS = {"load", "load_hdf5", "check_hdf5", "has_softmax", "read_header", "read_config", "read_bundle"}
# Rooms that read and write HDF5 files of their own (embedding outputs, token caches), never a model's weights.
OWN_HDF5 = ("embedding/", "engines/")  # their own outputs: embedding files, HDF5 shards


def _calls(root: str, skip: tuple[str, ...]):
  """(relative path, ast.Call, {alias: imported module}) of every call in elmo_jax/ outside the `skip` folders."""
  for module, path in sorted(_sources(root).items()):
    rel = os.path.relpath(path, os.path.join(root, "elmo_jax")).replace(os.sep, "/")
    if rel.startswith(skip):
      continue
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
      elif isinstance(node, ast.Import):
        aliases.update({a.asname or a.name: a.name for a in node.names})
    for node in ast.walk(tree):
      if isinstance(node, ast.Call):
        yield rel, node, aliases


def resolved_models_built(root: str = REPO_ROOT) -> list[str]:
  """Where a `ResolvedModel(...)` is built outside sources/ (what the resolver alone decides)."""
  return [f"{rel}:{node.lineno}" for rel, node, _ in _calls(root, ("sources/",))
          if (node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)) == "ResolvedModel"]


def model_file_reads(root: str = REPO_ROOT) -> list[str]:
  """Where a model file (options, weights of any format) is read outside formats/ and sources/: a format module's
  reader called, or an HDF5 file opened outside the rooms that keep HDF5 files of their own."""
  found = []
  for rel, node, aliases in _calls(root, ("formats/", "sources/")):
    func = node.func
    if not isinstance(func, ast.Attribute) or not isinstance(func.value, ast.Name):
      continue
    owner = aliases.get(func.value.id, func.value.id)
    if (owner in MODEL_FORMATS and func.attr in READERS) or (
        owner == "h5py" and func.attr == "File" and not rel.startswith(OWN_HDF5)):
      found.append(f"{rel}:{node.lineno} {func.value.id}.{func.attr}")
  return found


def test_no_resolved_model_built_outside_sources():
  assert resolved_models_built() == [], "build it with sources/resolve.resolve_model"


def test_no_model_file_read_outside_formats_and_sources():
  assert model_file_reads() == [], "read a model with sources/loaded (load_model, read_options, check_weights)"


def test_the_model_rules_find_a_planted_fault(tmp_path):
  root = _plant(tmp_path, {
      "cli/bad.py": "from elmo_jax.formats import weights as w\nfrom elmo_jax.sources.resolve import ResolvedModel\n"
                    "import h5py\n\ndef f(p):\n  w.load_hdf5(p, {})\n  h5py.File(p)\n  return ResolvedModel(path=p)\n",
      "sources/ok.py": "from elmo_jax.formats import weights\n\ndef g(p):\n  return weights.load_hdf5(p, {})\n"})
  assert resolved_models_built(root) == ["cli/bad.py:8"]
  assert model_file_reads(root) == ["cli/bad.py:6 w.load_hdf5", "cli/bad.py:7 h5py.File"]


# --- dependencies in plain sight: a room's imports of other rooms at its file's top ---------------------------------
# The imports of another room placed inside a function, each with why: an optional extra, or a module a light
# artifact must run without. Any other goes at the top of its file, where the floor plan can be read.
INNER_IMPORTS = {
    ("cli/serve.py", "elmo_jax.serving"): "serving/ needs the serve extra (starlette, uvicorn): its absence is one line",
    ("formats/stablehlo.py", "elmo_jax.model"): "a StableHLO artifact's loader imports jax and numpy only, no flax",
}
MAX_INNER_IMPORTS = 25


def inner_imports(root: str = REPO_ROOT) -> list[tuple[str, str, int]]:
  """(file under elmo_jax/, imported module, line) of every import of another room inside a function."""
  found = []
  for module, path in sorted(_sources(root).items()):
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    rel = os.path.relpath(path, os.path.join(root, "elmo_jax")).replace(os.sep, "/")
    for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
      for node in ast.walk(function):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        for name in names:
          if name.startswith("elmo_jax.") and _room(name) != _room(module):
            found.append((rel, name, node.lineno))
  return sorted(set(found))  # a nested function's import is walked from each enclosing function once


def _listed(rel: str, name: str) -> bool:
  return any(rel == f and (name == m or name.startswith(m + ".")) for f, m in INNER_IMPORTS)


def test_imports_of_other_rooms_sit_at_the_top_unless_listed_with_a_reason():
  found = inner_imports()
  unlisted = [f"{rel}:{line} {name}" for rel, name, line in found if not _listed(rel, name)]
  assert unlisted == [], "move these to the top of their files, or list them in INNER_IMPORTS with a reason"
  assert len(found) <= MAX_INNER_IMPORTS, found
  assert all(reason.strip() for reason in INNER_IMPORTS.values())


def test_the_inner_import_rule_finds_a_planted_one(tmp_path):
  root = _plant(tmp_path, {"cli/bad.py": "def f():\n  from elmo_jax.data import vocab\n  return vocab\n",
                           "cli/ok.py": "from elmo_jax.data import vocab\n\ndef g():\n  from elmo_jax.cli import bad\n"})
  assert inner_imports(root) == [("cli/bad.py", "elmo_jax.data", 2)]
