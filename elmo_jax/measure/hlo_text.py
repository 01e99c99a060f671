"""The text of an HLO module, parsed: computations of instructions (`parse_module`), type texts' arrays and bytes.

    comps = parse_module(compiled.as_text())   # name -> Computation(instrs=[Instr(name, shape, op, ...)])
    nbytes("(s32[], bf16[2,3]{1,0})")           # 16: the bytes of every array in a type text
    nbytes("f32[8]{0:S(1)}", hbm_only=True)     # 0: an array in another memory space (TPU VMEM) is not HBM

Only the syntax: what the instructions cost is `elmo_jax.measure.hlo.Module`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
               "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
               "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
# an array with its layout, if any: `f32[8,128]{1,0:T(8,128)S(1)}` (memory space 1: TPU VMEM, on chip)
_ARRAY_LAYOUT = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\](\{[^{}]*\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")


@dataclasses.dataclass
class Instr:
  name: str
  shape: str  # result type text, e.g. "f32[128,512]{1,0}" or a tuple "(s32[], bf16[...])"
  op: str
  operands: list[str]
  args: str  # the text inside the parentheses: operands, or a parameter's index / a constant's value
  attrs: str  # everything after the operand list
  root: bool = False


@dataclasses.dataclass
class Computation:
  name: str
  instrs: list[Instr]
  entry: bool = False

  def __post_init__(self):
    self.by_name = {i.name: i for i in self.instrs}


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """The (dtype, dims) of every array in a type text (a tuple lists several)."""
  out = []
  for dtype, dims in _ARRAY.findall(shape):
    if dtype in DTYPE_BYTES:
      out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
  return out


def memory_spaces(shape: str) -> list[tuple[str, tuple[int, ...], int]]:
  """(dtype, dims, memory space) of every array in a type text: the layout's `S(n)`, 0 (device memory, HBM)
  when the layout names none. On TPU, space 1 is VMEM (on-chip); other nonzero spaces are not HBM either."""
  out = []
  for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape):
    if dtype in DTYPE_BYTES:
      space = _SPACE.search(layout) if layout and ":" in layout else None
      out.append((dtype, tuple(int(d) for d in dims.split(",") if d), int(space.group(1)) if space else 0))
  return out


def nbytes(shape: str, hbm_only: bool = False) -> int:
  """The bytes of every array in a type text; with `hbm_only`, of those in device memory (no `S(n)`, n > 0)."""
  if hbm_only:
    return int(sum(math.prod(d) * DTYPE_BYTES[t] for t, d, space in memory_spaces(shape) if space == 0))
  return int(sum(math.prod(d) * DTYPE_BYTES[t] for t, d in arrays(shape)))


def on_chip(shape: str) -> bool:
  """Whether every array of a type text sits outside device memory (a nonzero memory space, TPU VMEM)."""
  parts = memory_spaces(shape)
  return bool(parts) and all(space != 0 for _, _, space in parts)


def tuple_elements(shape: str) -> list[str]:
  """The top-level elements of a tuple type text, `[shape]` if it is not a tuple."""
  shape = re.sub(r"/\*[^*]*\*/", "", shape).strip()
  if not shape.startswith("("):
    return [shape]
  out, depth, start = [], 0, 1
  for i, c in enumerate(shape):
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
      if depth == 0:
        out.append(shape[start:i].strip())
    elif c == "," and depth == 1:
      out.append(shape[start:i].strip())
      start = i + 1
  return [e for e in out if e]


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start] ('(' or '{')."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  stack = []
  for i in range(start, len(text)):
    c = text[i]
    if c in pairs:
      stack.append(pairs[c])
    elif stack and c == stack[-1]:
      stack.pop()
      if not stack:
        return i + 1
  return len(text)


def _parse_instr(line: str) -> Instr | None:
  m = _INSTR.match(line)
  if not m:
    return None
  rest = line[m.end():]
  end = _balanced(rest, 0) if rest.startswith("(") else rest.find(" ")  # a tuple, or dims{layout}
  shape, rest = rest[:end], rest[end:].lstrip()
  op_end = rest.find("(")
  if op_end < 0:
    return None
  op = rest[:op_end].strip()
  close = _balanced(rest, op_end)
  operands = re.findall(r"%([\w.\-]+)", rest[op_end:close])
  return Instr(m.group(2), shape, op, operands, rest[op_end + 1:close - 1], rest[close:], bool(m.group(1)))


def parse_module(text: str) -> dict[str, Computation]:
  """Computation name -> Computation of an HLO module's text."""
  comps: dict[str, Computation] = {}
  current: list[Instr] | None = None
  name, entry = "", False
  for line in text.splitlines():
    if current is None:
      m = _HEADER.match(line)
      if m:
        current, name, entry = [], m.group(2), bool(m.group(1))
      continue
    if line.strip() == "}":
      comps[name] = Computation(name, current, entry)
      current = None
      continue
    instr = _parse_instr(line)
    if instr is not None:
      current.append(instr)
  return comps


def attr(attrs: str, key: str) -> str | None:
  """The value of `key=VALUE` in an instruction's attributes (a computation name loses its `%`), else None."""
  m = re.search(rf"\b{key}=([%\w.\-]+)", attrs)
  return m.group(1).lstrip("%") if m else None


def braced_ints(attrs: str, key: str) -> list[int]:
  """The integers of `key={1,2}` in an instruction's attributes, [] when it is absent."""
  m = re.search(rf"\b{key}=\{{([0-9,]*)\}}", attrs)
  return [int(x) for x in m.group(1).split(",") if x] if m else []


def backend_config(attrs: str) -> dict:
  """An instruction's `backend_config={...}` JSON, {} when it is absent or not JSON."""
  i = attrs.find("backend_config=")
  if i < 0:
    return {}
  j = i + len("backend_config=")
  if j < len(attrs) and attrs[j] == "{":
    try:
      return json.loads(attrs[j:_balanced(attrs, j)])
    except ValueError:
      return {}
  return {}
