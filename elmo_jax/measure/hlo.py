"""Reads an optimized, SPMD-partitioned HLO module (`compiled.as_text()`): per-device work with loop trip counts.

XLA's cost analysis counts a `while` body once, however many times it runs (our LSTM scans run `unroll_steps`
times), and on GPU `compiled.cost_analysis()` is None. So the planner reads the HLO text itself, which is the
same on every backend: computations, their instructions with shapes, and how they call each other
(fusions, while bodies with their trip counts, calls). From it:

  * `flops`: matmul and convolution FLOPs (2 x multiply-adds; TPU writes dots as `convolution`, GPU as
    cuBLAS custom calls), each loop body times its trip count. Elementwise work is not counted (the MFU
    convention).
  * `hbm_bytes`: bytes each kernel reads and writes (operands + results of every top-level instruction of
    the entry, loop bodies and calls; a fusion's operand that it only slices counts the slice, an in-place
    dynamic-update-slice counts the update), times trip counts. An estimate of HBM traffic, not a measurement;
    `kernel_traffic` lists its largest terms. An array whose layout puts it in another memory space
    (`{1,0:T(8,128)S(1)}`: TPU VMEM, on chip) is not HBM traffic: it is not counted (`hbm_only`, the
    default; `Module(text, hbm_only=False)` counts every operand, as XLA's `bytes accessed` does), and an
    async copy between the spaces (a prefetch or eviction) counts its HBM side once.
  * `collectives`: every all-reduce / all-gather / reduce-scatter / all-to-all / collective-permute with its
    per-device result bytes, times trip counts.
  * `loops`: each while loop's trip count and the kernels (top-level instructions that launch work) in its
    body: on a GPU each is a launch per iteration.

Everything here is text processing of the module the compiler produced (parsed by `elmo_jax.measure.hlo_text`);
nothing is compiled or run.
"""
from __future__ import annotations

import math
import re
from typing import Iterator

from elmo_jax.measure.hlo_text import DTYPE_BYTES, Computation, Instr, arrays, attr, backend_config, braced_ints
from elmo_jax.measure.hlo_text import nbytes, on_chip, parse_module, tuple_elements

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# Instructions that move no data and launch nothing.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
         "replica-id", "opt-barrier", "add-dependency", "iota", "while", "call", "conditional", "domain"}


def _moves_nothing(instr: Instr) -> bool:
  """Bookkeeping that launches no kernel and moves no bytes: `_FREE` ops, the `-done` half of an async op, and
  `AllocateBuffer` (`lax.empty`: a buffer reserved, never written)."""
  return (instr.op in _FREE or instr.op.endswith("-done")
          or (instr.op == "custom-call" and 'custom_call_target="AllocateBuffer"' in instr.attrs))


class Module:
  """An optimized HLO module: its computations, and walks over what the entry computation executes."""

  def __init__(self, text: str, hbm_only: bool = True):
    self.hbm_only = hbm_only  # arrays in another memory space (TPU VMEM, `S(1)`) are not HBM traffic
    self.comps = parse_module(text)
    entries = [c for c in self.comps.values() if c.entry]
    if not entries:
      raise ValueError("no ENTRY computation in the HLO text")
    self.entry = entries[0]

  # --- shapes -------------------------------------------------------------------------------------------
  def _operand_shape(self, comp: Computation, instr: Instr, k: int) -> str:
    if k >= len(instr.operands):
      return ""
    other = comp.by_name.get(instr.operands[k])
    return other.shape if other is not None else ""

  # --- loops --------------------------------------------------------------------------------------------
  def trip_count(self, instr: Instr) -> int:
    """A while loop's trip count: the compiler's `known_trip_count`, else `i < N` in its condition."""
    known = backend_config(instr.attrs).get("known_trip_count", {}).get("n")
    if known is not None:
      return int(known)
    cond = self.comps.get(attr(instr.attrs, "condition") or "")
    if cond is not None:
      root = next((i for i in cond.instrs if i.root), None)
      if root is not None and root.op == "compare" and "direction=LT" in root.attrs:
        for operand in root.operands:  # JAX's loops count from 0 in steps of 1
          c = cond.by_name.get(operand)
          if c is not None and c.op == "constant" and c.args.strip().lstrip("-").isdigit():
            return int(c.args)
    return 1

  def walk(self, comp: Computation | None = None, times: int = 1, fused: bool = False
           ) -> Iterator[tuple[Computation, Instr, int, bool]]:
    """(computation, instruction, executions per step, inside a fusion) for every instruction reachable."""
    comp = comp or self.entry
    for instr in comp.instrs:
      yield comp, instr, times, fused
      if instr.op == "while":
        n = self.trip_count(instr)
        for key in ("body", "condition"):
          callee = self.comps.get(attr(instr.attrs, key) or "")
          if callee is not None:
            yield from self.walk(callee, times * n, fused)
      elif instr.op == "call" or "calls=" in instr.attrs:  # fusions, calls, async wrappers (not reducers)
        callee = self.comps.get(attr(instr.attrs, "calls") or attr(instr.attrs, "to_apply") or "")
        if callee is not None:
          yield from self.walk(callee, times, fused or instr.op == "fusion")
      elif instr.op == "conditional":
        m = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
        for name in re.findall(r"%?([\w.\-]+)", m.group(1)) if m else []:
          if name in self.comps:
            yield from self.walk(self.comps[name], times, fused)

  # --- FLOPs --------------------------------------------------------------------------------------------
  def instr_flops(self, comp: Computation, instr: Instr) -> float:
    """2 x multiply-adds of a dot, convolution or library matmul/conv call; 0 for anything else."""
    op = instr.op
    if op == "dot":
      out = arrays(instr.shape)
      lhs = arrays(self._operand_shape(comp, instr, 0))
      if not out or not lhs:
        return 0.0
      k = math.prod(lhs[0][1][d] for d in braced_ints(instr.attrs, "lhs_contracting_dims"))
      return 2.0 * math.prod(out[0][1]) * k
    if op == "convolution":
      return self._conv_flops(instr.attrs, arrays(instr.shape), arrays(self._operand_shape(comp, instr, 1)))
    if op == "custom-call":
      target = re.search(r'custom_call_target="([^"]+)"', instr.attrs)
      target = target.group(1) if target else ""
      out = arrays(instr.shape)
      if "gemm" in target or "matmul" in target:
        dims = backend_config(instr.attrs).get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
        lhs = arrays(self._operand_shape(comp, instr, 0))
        if not out or not lhs:
          return 0.0
        k = math.prod(lhs[0][1][int(d)] for d in dims.get("lhs_contracting_dimensions", []))
        return 2.0 * math.prod(out[0][1]) * k
      if "conv" in target:
        a, b = arrays(self._operand_shape(comp, instr, 0)), arrays(self._operand_shape(comp, instr, 1))
        if "BackwardFilter" in target:  # (input, d_output) -> filter
          return self._conv_flops(instr.attrs, b, out)
        if "BackwardInput" in target:  # (d_output, filter) -> d_input
          return self._conv_flops(instr.attrs, a, b)
        return self._conv_flops(instr.attrs, out, b)
    return 0.0

  @staticmethod
  def _conv_flops(attrs: str, out, kernel) -> float:
    """2 x output elements x (kernel elements per output feature that meet real input elements).

    TPU writes batched matmuls as convolutions over a dilated spatial axis (`window={size=2 lhs_dilate=2}`):
    of a window of w taps over input dilated by d, only ceil(w / d) meet input elements.
    """
    if not out or not kernel:
      return 0.0
    labels = re.search(r"dim_labels=\w+_(\w+)->", attrs)
    o = labels.group(1).index("o") if labels and "o" in labels.group(1) else -1
    dims = kernel[0][1]
    per_output = math.prod(dims) / max(dims[o], 1) if dims else 1
    size = re.search(r"window=\{[^}]*\bsize=([0-9x]+)", attrs)
    dilate = re.search(r"window=\{[^}]*\blhs_dilate=([0-9x]+)", attrs)
    if size and dilate:
      for w, d in zip(map(int, size.group(1).split("x")), map(int, dilate.group(1).split("x"))):
        per_output *= math.ceil(w / d) / w
    return 2.0 * math.prod(out[0][1]) * per_output

  def flops(self) -> float:
    return sum(self.instr_flops(c, i) * n for c, i, n, _ in self.walk())

  # --- memory traffic -----------------------------------------------------------------------------------
  @staticmethod
  def _users(comp: Computation, name: str) -> list[Instr]:
    """Instructions reading `name`, looking through bitcasts (a bitcast's users stand for it)."""
    out = []
    for i in comp.instrs:
      if name in i.operands:
        out.extend(Module._users(comp, i.name) if i.op == "bitcast" else [i])
    return out

  @staticmethod
  def _produced_by(comp: Computation, name: str) -> Instr | None:
    i = comp.by_name.get(name)
    while i is not None and i.op == "bitcast" and i.operands:
      i = comp.by_name.get(i.operands[0])
    return i

  def _nb(self, shape: str) -> int:
    """The HBM bytes of a type text: all its arrays, or (`hbm_only`) those in device memory."""
    return nbytes(shape, hbm_only=self.hbm_only)

  def _chip(self, shape: str) -> bool:
    """Whether a type text's arrays are all on chip (and `hbm_only` leaves them out)."""
    return self.hbm_only and on_chip(shape)

  def _fusion_operand_bytes(self, callee: Computation, k: int, full: int) -> int:
    """Bytes a fusion reads of its k-th operand: the slices it takes if it only slices it, nothing if it
    only updates it in place (or `full` = 0: it is on chip)."""
    param = next((i for i in callee.instrs if i.op == "parameter" and i.args.strip() == str(k)), None)
    if param is None or full == 0:
      return full
    users = self._users(callee, param.name)
    sliced = lambda u: u.op in ("dynamic-slice", "slice", "gather") and self._produced_by(callee, u.operands[0]) is param
    if users and all(sliced(u) for u in users):
      return sum(nbytes(u.shape) for u in users)
    if users and all(u.op == "dynamic-update-slice" and self._produced_by(callee, u.operands[0]) is param
                     for u in users):
      return 0  # updated in place: only the update is written
    return full

  def _fusion_output_bytes(self, callee: Computation, shape: str) -> int:
    """Bytes a fusion writes: each output, or only the update of an output made by dynamic-update-slice;
    nothing for an output on chip (the fusion's own result type `shape` says where each output sits)."""
    root = next((i for i in callee.instrs if i.root), None)
    if root is None:
      return self._nb(shape)
    outputs = [self._produced_by(callee, o) for o in root.operands] if root.op == "tuple" else [
        self._produced_by(callee, root.name)]
    placed = tuple_elements(shape) if root.op == "tuple" else [shape]
    total = 0
    for k, o in enumerate(outputs):
      if o is None or (k < len(placed) and self._chip(placed[k])):
        continue
      if o.op == "dynamic-update-slice" and len(o.operands) > 1 and o.operands[1] in callee.by_name:
        total += nbytes(callee.by_name[o.operands[1]].shape)
      else:
        total += nbytes(o.shape)
    return total

  def instr_bytes(self, comp: Computation, instr: Instr) -> int:
    """Bytes of HBM one execution of a kernel-level instruction reads and writes (0 for bookkeeping ops)."""
    if _moves_nothing(instr):
      return 0
    out = self._nb(instr.shape)
    operand = lambda k: self._operand_shape(comp, instr, k)
    if instr.op == "dynamic-update-slice":  # reads the update, writes it into the (aliased) buffer
      update = nbytes(operand(1))
      return (0 if self._chip(operand(1)) else update) + (0 if self._chip(instr.shape) else update)
    if instr.op in ("dynamic-slice", "slice"):  # reads the slice of its operand, writes it
      return (0 if self._chip(operand(0)) else nbytes(instr.shape)) + out
    if instr.op.endswith("-start") and instr.op[:-len("-start")] not in COLLECTIVES:
      elements = tuple_elements(instr.shape)
      if instr.op == "copy-start" and len(elements) >= 2:  # (destination, source, context): a prefetch or
        return self._nb(elements[0]) + self._nb(elements[1])  # eviction between memory spaces counts once
      if len(elements) >= 2:  # async slice etc.: ((operands), result, context): the result read and written
        return 2 * self._nb(elements[1])
    if instr.op == "fusion":
      callee = self.comps.get(attr(instr.attrs, "calls") or "")
      if callee is not None:
        reads = sum(self._fusion_operand_bytes(callee, k, self._nb(operand(k))) for k in range(len(instr.operands)))
        return reads + self._fusion_output_bytes(callee, instr.shape)
    return out + sum(self._nb(operand(k)) for k in range(len(instr.operands)))

  def hbm_bytes(self) -> float:
    return float(sum(self.instr_bytes(c, i) * n for c, i, n, fused in self.walk() if not fused))

  def kernel_traffic(self, top: int = 15) -> list[dict]:
    """The `top` kernels by HBM bytes per step (the terms of `hbm_bytes`, largest first): name, op, the
    computation it runs in (a loop body runs trip-count times), result type, bytes per execution,
    executions per step, bytes per step and the JAX op that made it (metadata op_name)."""
    rows = []
    for comp, instr, n, fused in self.walk():
      b = 0 if fused else self.instr_bytes(comp, instr)
      if b:
        meta = re.search(r'op_name="([^"]+)"', instr.attrs)
        rows.append({"name": instr.name, "op": instr.op, "computation": comp.name, "shape": instr.shape[:120],
                     "bytes": b, "count": n, "bytes_per_step": b * n, "op_name": meta.group(1) if meta else ""})
    return sorted(rows, key=lambda r: -r["bytes_per_step"])[:top]

  # --- collectives --------------------------------------------------------------------------------------
  def collectives(self) -> list[dict]:
    """Every collective: op kind, dtype/shape of its largest array, per-device bytes, executions, group size."""
    out = []
    for comp, instr, n, _ in self.walk():
      op = instr.op[:-len("-start")] if instr.op.endswith("-start") else instr.op
      if op not in COLLECTIVES:
        continue
      shape = instr.shape
      if instr.op.endswith("-start"):
        elements = tuple_elements(shape)
        if len(elements) >= 2 and (elements[0].startswith("(") or op == "collective-permute"):
          shape = elements[1]  # ((operands), (results), ...): the results
      parts = arrays(shape)
      if not parts:
        continue
      size = int(sum(math.prod(d) * DTYPE_BYTES[t] for t, d in parts))
      dtype, dims = max(parts, key=lambda p: math.prod(p[1]) * DTYPE_BYTES[p[0]])
      out.append({"op": op, "dtype": dtype, "shape": list(dims), "bytes": size, "count": n,
                  "group_size": group_size(instr.attrs)})
    return out

  # --- kernels ------------------------------------------------------------------------------------------
  def kernels(self, comp: Computation) -> int:
    """Top-level instructions of a computation that launch work (a fusion or library call is one)."""
    return sum(1 for i in comp.instrs if not _moves_nothing(i))

  def loops(self) -> list[dict]:
    """Each while loop: trip count, kernels per iteration (body + condition), launches per step."""
    out = []
    for comp, instr, n, fused in self.walk():
      if instr.op != "while" or fused:
        continue
      trips = self.trip_count(instr)
      body = self.comps.get(attr(instr.attrs, "body") or "")
      cond = self.comps.get(attr(instr.attrs, "condition") or "")
      k = (self.kernels(body) if body else 0) + (self.kernels(cond) if cond else 0)
      meta = re.search(r'op_name="([^"]+)"', instr.attrs)
      out.append({"name": instr.name, "op_name": meta.group(1) if meta else "", "trip_count": trips,
                  "kernels_per_iteration": k, "launches_per_step": k * trips * n,
                  "flops_per_iteration": sum(self.instr_flops(c, i) * m for c, i, m, _ in self.walk(body)) if body else 0})
    return out

  def launches(self) -> int:
    """Kernel launches per step: every kernel-level instruction outside fusions, times its executions."""
    return int(sum(n for c, i, n, fused in self.walk() if not fused and not _moves_nothing(i)))


def group_size(attrs: str) -> int | None:
  """Devices per replica group of a collective, from `replica_groups` (list, iota or mesh form)."""
  m = re.search(r"replica_groups=\{\{([0-9,]*)\}", attrs)
  if m:
    return len([x for x in m.group(1).split(",") if x])
  m = re.search(r"replica_groups=\[(\d+),(\d+)\]", attrs)
  if m:
    return int(m.group(2))
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)) if a in sizes)
  return None
