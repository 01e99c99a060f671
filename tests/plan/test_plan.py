"""The AOT planner (`python -m elmo_jax plan`) and what it says about the data-parallel step.

On 2, 4 and 8 simulated CPU devices (a subprocess: the device count is fixed when JAX starts): the train step
fits, its only large collective is the gradient all-reduce, its per-device FLOPs do not depend on the device
count and match the analytic count. TPU (libtpu) and GPU (CUDA plugin) compiles run when those optional
packages are importable; CI has neither (they are not in requirements.txt).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from elmo_jax.measure import chips as chips_lib
from elmo_jax.measure import hlo as hlo_lib
from elmo_jax.measure import hlo_text
from elmo_jax.plan import targets as targets_lib
import launch_util
import tiny
from paths import REPO_ROOT, TESTS_DIR

PYTHON = sys.executable

_SCRIPT = textwrap.dedent(r"""
  import json, os, sys
  sys.path[:0] = sys.argv[1].split(os.pathsep)
  import tiny
  from elmo_jax.plan import train as plan
  out = {}
  for spec in sys.argv[2:]:
    config = tiny.train_config("unused.txt", **{"n_negative_samples": 12, "shard_softmax": True,
                                                "data.vocab_max_size": 300})
    r = plan.plan(config, spec, per_device_batch=4, with_eval=spec == "cpu:8")
    out[spec] = r
  print(json.dumps(out))
""")


def _plan_cpu(tmp_path, *specs):
  script = tmp_path / "plan.py"
  script.write_text(_SCRIPT)
  # The planner reports the compiled program (its loops, kernels): compiled with the product's fusion emitters.
  env = {**os.environ, "XLA_FLAGS": launch_util.xla_flags(8, product_emitters=True), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([PYTHON, str(script), os.pathsep.join((os.path.dirname(__file__), TESTS_DIR)), *specs], env=env,
                        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_step_work_per_device_does_not_grow_with_devices(tmp_path):
  """The shard_map step on 2, 4, 8 devices at 4 rows each: same FLOPs per device (the analytic count), fits,
  no all-gather of activations (the old GSPMD step gathered the global batch's LSTM gates)."""
  reports = _plan_cpu(tmp_path, "cpu:2", "cpu:4", "cpu:8")
  flops = {spec: r["flops_per_device_per_step"] for spec, r in reports.items()}
  print(json.dumps({s: {k: r[k] for k in ("flops_per_device_per_step", "collective_bytes_per_device",
                                          "analytic_train_flops_per_token", "flops_per_token")}
                    for s, r in reports.items()}, indent=1))
  base = flops["cpu:2"]
  for spec, r in reports.items():
    assert r["fits"] and r["hbm_bytes"]["temporaries"] > 0
    assert abs(flops[spec] - base) <= 0.05 * base, flops
    # loop-corrected FLOPs per token within 10% of the analytic count (both: matmul/conv only)
    assert abs(r["flops_per_token"] / r["analytic_train_flops_per_token"] - 1) < 0.10, r["flops_per_token"]
    gathers = [c for c in r["largest_collectives"] if c["op"] == "all-gather"]
    assert all(c["bytes"] < 1_000_000 for c in gathers), gathers
    assert set(r["collective_bytes_per_device"]) <= {"all-reduce", "all-gather", "reduce-scatter", "all-to-all"}
    assert r["collective_bytes_per_device"]["all-reduce"] > 0  # the gradient reduction
  eight = reports["cpu:8"]
  assert eight["eval"]["fits"] and eight["eval"]["flops_per_device_per_step"] > 0
  assert eight["loops"] and all(loop["trip_count"] == eight["unroll_steps"] for loop in eight["loops"])


def _run_plan(config, *args):
  # The command sets the CPU device count for a cpu:N target itself; opt level 0 stays, with the product's
  # fusion emitters (the report describes the compiled program).
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": launch_util.xla_flags(None, product_emitters=True)}
  return subprocess.run([PYTHON, "-m", "elmo_jax", "plan", f"--config={config}", *args], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a subprocess compile on 8 simulated devices
def test_plan_on_cpu_devices_json(tmp_path):
  """`python -m elmo_jax plan --target=cpu:2 --json`: fits, the report's keys, the gradient all-reduce as the
  collective, loop-corrected FLOPs at the analytic count (the tiny model, sampled softmax split over P)."""
  config = tiny.write_train_config(str(tmp_path / "config.py"), "unused.txt", n_negative_samples=12,
                                   shard_softmax=True, **{"data.vocab_max_size": 300})
  proc = _run_plan(config, "--target=cpu:2", "--per_device_batch=4", "--json", "--noeval",
                   f"--dump_hlo={tmp_path / 'step.hlo'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(proc.stdout[proc.stdout.index("{"):])
  for key in ("target", "devices", "fits", "hbm_bytes", "flops_per_device_per_step", "collective_bytes_per_device",
              "largest_collectives", "roofline"):
    assert key in r, key
  assert r["devices"] == 2 and r["global_batch"] == 8 and r["fits"] is True
  assert set(r["hbm_bytes"]) >= {"arguments", "temporaries", "outputs", "capacity"} and r["hbm_bytes"]["temporaries"] > 0
  assert set(r["roofline"]) >= {"step_s", "tokens_per_s_per_device", "mfu_bound"}
  assert abs(r["flops_per_token"] / r["analytic_train_flops_per_token"] - 1) < 0.10, r["flops_per_token"]
  assert r["collective_bytes_per_device"]["all-reduce"] > 0
  assert all(c["bytes"] < 1_000_000 for c in r["largest_collectives"] if c["op"] == "all-gather")
  assert all(loop["trip_count"] == r["unroll_steps"] for loop in r["loops"]) and r["loops"]
  rf = r["roofline"]
  assert rf["step_s"] == max(v for k, v in rf.items() if k.endswith("_s") and k != "step_s") > 0
  assert 0 < rf["mfu_bound"] <= 1
  assert "ENTRY" in (tmp_path / "step.hlo").read_text()


@pytest.mark.slow
def test_plan_report_and_one_line_errors(tmp_path):
  config = tiny.write_train_config(str(tmp_path / "config.py"), "unused.txt")
  text = _run_plan(config, "--target=cpu:2", "--per_device_batch=2")
  assert text.returncode == 0, text.stderr[-3000:]
  assert "train step: FITS" in text.stdout and "eval step:  FITS" in text.stdout and "roofline step" in text.stdout
  bad = _run_plan(config, "--target=v9x:2x2")
  assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("plan: error: --target='v9x:2x2'")
  assert "Traceback" not in bad.stderr
  if importlib.util.find_spec("libtpu") is None:  # CI: the optional TPU compiler is not installed
    missing = _run_plan(config, "--target=v5e:2x2")
    assert missing.returncode == 1 and 'pip install -e ".[plan-tpu]"' in missing.stderr.strip().splitlines()[-1]


_HLO = """HloModule m

%fused_dot (p0: f32[8,16], p1: f32[16,4]) -> f32[8,4] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = f32[16,4]{1,0} parameter(1)
  ROOT %d = f32[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (t: (s32[], f32[8,16], f32[16,4], f32[6,8,4])) -> (s32[], f32[8,16], f32[16,4], f32[6,8,4]) {
  %t = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}, f32[6,8,4]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%t), index=1
  %w = f32[16,4]{1,0} get-tuple-element(%t), index=2
  %acc = f32[6,8,4]{2,1,0} get-tuple-element(%t), index=3
  %f = f32[8,4]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot
  %ar = f32[16,4]{1,0} all-reduce(%w), replica_groups=[1,4]<=[4], to_apply=%add
  ROOT %out = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}, f32[6,8,4]{2,1,0}) tuple(%i, %x, %ar, %acc)
}

%cond (t: (s32[], f32[8,16], f32[16,4], f32[6,8,4])) -> pred[] {
  %t = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}, f32[6,8,4]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %n = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main (a: f32[8,16], b: f32[16,4]) -> f32[8,4] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %z = s32[] constant(0)
  %acc = f32[6,8,4]{2,1,0} broadcast(%z), dimensions={}
  %init = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}, f32[6,8,4]{2,1,0}) tuple(%z, %a, %b, %acc)
  %loop = (s32[], f32[8,16]{1,0}, f32[16,4]{1,0}, f32[6,8,4]{2,1,0}) while(%init), condition=%cond, body=%body
  %c = f32[8,4]{1,0} convolution(%a, %b), window={size=2 lhs_dilate=2}, dim_labels=bf_io->bf
  ROOT %ag = f32[8,4]{1,0} all-gather(%c), replica_groups={{0,1,2,3}}, dimensions={0}
}
"""


def test_hlo_reader_applies_trip_counts_and_reads_collectives():
  """A hand-written module: a 6-iteration loop (trip count from `i < 6`) with a fused dot and an all-reduce."""
  m = hlo_lib.Module(_HLO)
  dot = 2 * 8 * 4 * 16
  conv = 2 * 8 * 4 * 16 * 0.5  # a window of 2 taps over input dilated by 2 meets one input element
  assert m.flops() == 6 * dot + conv
  (loop,) = m.loops()
  assert loop["trip_count"] == 6 and loop["kernels_per_iteration"] == 3  # fusion + all-reduce + compare
  coll = {c["op"]: c for c in m.collectives()}
  assert coll["all-reduce"]["count"] == 6 and coll["all-reduce"]["bytes"] == 16 * 4 * 4
  assert coll["all-reduce"]["group_size"] == 4 and coll["all-gather"]["group_size"] == 4
  assert hlo_text.nbytes("(s32[], bf16[2,3]{1,0})") == 4 + 12


def test_hbm_traffic_estimate_on_programs_counted_by_hand():
  """The estimator on three tiny CPU programs of f32[256, 256] (256 KiB) arrays, whose kernels' reads and
  writes are counted by hand; where there is no loop, XLA's own cost analysis agrees to the byte."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = 256 * 256 * 4

  def estimate(f, *args):
    compiled = jax.jit(f).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    m = hlo_lib.Module(compiled.as_text())
    return m.hbm_bytes(), float(cost["bytes accessed"]), m.kernel_traffic()

  x, w = jnp.ones((256, 256)), jnp.ones((256, 64))
  est, xla, kernels = estimate(lambda x, y: jnp.tanh(x) + y, x, x)
  assert est == xla == 3 * a  # one fusion: reads x and y, writes the sum
  assert len(kernels) == 1 and kernels[0]["op"] == "fusion" and kernels[0]["bytes_per_step"] == 3 * a
  est, xla, kernels = estimate(lambda x, w: jnp.tanh(x @ w), x, w)
  assert est == xla == (a + a // 4 + a // 4) + 2 * (a // 4)  # the dot reads x, w, writes x w; tanh reads, writes
  # a 10-step loop of an elementwise kernel on the carry: the body's read + write 10 times, plus one copy of
  # the carry in and the loop counter's scalars (under 1 KB); XLA's cost analysis counts the body once
  est, xla, kernels = estimate(lambda x: jax.lax.fori_loop(0, 10, lambda i, c: jnp.tanh(c) * 2.0, x), x)
  assert 11 * 2 * a <= est < 11 * 2 * a + 1000, est
  assert 2 * 2 * a <= xla < 2 * 2 * a + 1000, xla
  top = kernels[0]
  assert (top["bytes"], top["count"], top["bytes_per_step"]) == (2 * a, 10, 20 * a), top


# A scan's output buffer as `lax.empty` gives it (XLA's AllocateBuffer) against the zero fill `lax.scan` writes,
# each then updated in place: the buffer reserved moves no bytes and launches nothing, the zeros are a write.
_HLO_EMPTY = """
HloModule empty

ENTRY %main (u: f32[1,256]) -> (f32[64,256], f32[64,256]) {
  %u = f32[1,256]{1,0} parameter(0)
  %empty = f32[64,256]{1,0} custom-call(), custom_call_target="AllocateBuffer"
  %zero = f32[] constant(0)
  %zeros = f32[64,256]{1,0} broadcast(%zero), dimensions={}
  %i = s32[] constant(3)
  %z = s32[] constant(0)
  %d0 = f32[64,256]{1,0} dynamic-update-slice(%empty, %u, %i, %z)
  %d1 = f32[64,256]{1,0} dynamic-update-slice(%zeros, %u, %i, %z)
  ROOT %out = (f32[64,256]{1,0}, f32[64,256]{1,0}) tuple(%d0, %d1)
}
"""


def test_an_allocated_buffer_is_not_traffic_but_a_zero_fill_is():
  """Counted by hand: the zero fill reads its scalar and writes 64 x 256 floats (64 KiB), each update reads and
  writes one row (1 KiB each way); AllocateBuffer is neither bytes nor a kernel launch."""
  m = hlo_lib.Module(_HLO_EMPTY)
  by_name = {r["name"]: r["bytes"] for r in m.kernel_traffic(20)}
  assert by_name == {"zeros": 4 + 64 * 256 * 4, "d0": 2 * 256 * 4, "d1": 2 * 256 * 4}, by_name
  assert m.launches() == 3


# A TPU-style module (no compile: text only) with arrays in VMEM (`S(1)` in the layout): a prefetch of %b
# into VMEM, a fusion writing one output to VMEM and one to HBM, and a dynamic-update-slice into a VMEM buffer.
_HLO_S1 = """
HloModule vmem

%fused_add (p0: f32[8,128], p1: f32[8,128]) -> f32[8,128] {
  %p0 = f32[8,128]{1,0} parameter(0)
  %p1 = f32[8,128]{1,0} parameter(1)
  ROOT %s = f32[8,128]{1,0} add(%p0, %p1)
}

%fused_two (q0: f32[8,128]) -> (f32[8,128], f32[8,128]) {
  %q0 = f32[8,128]{1,0} parameter(0)
  %e = f32[8,128]{1,0} exponential(%q0)
  %n = f32[8,128]{1,0} negate(%q0)
  ROOT %r = (f32[8,128]{1,0}, f32[8,128]{1,0}) tuple(%e, %n)
}

ENTRY %main (a: f32[8,128], b: f32[8,128], buf: f32[4,8,128]) -> (f32[8,128], f32[4,8,128]) {
  %a = f32[8,128]{1,0:T(8,128)} parameter(0)
  %b = f32[8,128]{1,0:T(8,128)} parameter(1)
  %buf = f32[4,8,128]{2,1,0:T(8,128)S(1)} parameter(2)
  %cs = (f32[8,128]{1,0:T(8,128)S(1)}, f32[8,128]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%b)
  %bv = f32[8,128]{1,0:T(8,128)S(1)} copy-done(%cs)
  %two = (f32[8,128]{1,0:T(8,128)S(1)}, f32[8,128]{1,0:T(8,128)}) fusion(%a), kind=kLoop, calls=%fused_two
  %e = f32[8,128]{1,0:T(8,128)S(1)} get-tuple-element(%two), index=0
  %n = f32[8,128]{1,0:T(8,128)} get-tuple-element(%two), index=1
  %f = f32[8,128]{1,0:T(8,128)S(1)} fusion(%e, %bv), kind=kLoop, calls=%fused_add
  %g = f32[8,128]{1,0:T(8,128)} fusion(%f, %n), kind=kLoop, calls=%fused_add
  %i = s32[] constant(1)
  %z = s32[] constant(0)
  %u = f32[1,8,128]{2,1,0:T(8,128)S(1)} bitcast(%f)
  %d = f32[4,8,128]{2,1,0:T(8,128)S(1)} dynamic-update-slice(%buf, %u, %i, %z, %z)
  %t = f32[8,128]{1,0:T(8,128)} tanh(%g)
  ROOT %out = (f32[8,128]{1,0:T(8,128)}, f32[4,8,128]{2,1,0:T(8,128)S(1)}) tuple(%t, %d)
}
"""


def test_hbm_traffic_leaves_out_arrays_in_vmem():
  """Arrays in memory space S(1) (TPU VMEM) are on chip: not HBM traffic. Counted by hand, a = 4 KiB:
  the prefetch reads %b from HBM once (its VMEM side is free), %two reads a and writes %n to HBM (%e stays in
  VMEM), %f reads and writes only VMEM, %g reads %n and writes to HBM, the update of the VMEM buffer moves
  nothing in HBM, tanh reads and writes HBM. Counting every operand (XLA's `bytes accessed`) gives each
  kernel's operands and results: 2 + 3 + 3 + 3 + 2 (the update: read + write) + 2."""
  a = 8 * 128 * 4
  assert hlo_text.memory_spaces("(f32[8,128]{1,0:T(8,128)S(1)}, bf16[2]{0}, s32[])") == [
      ("f32", (8, 128), 1), ("bf16", (2,), 0), ("s32", (), 0)]
  assert hlo_text.nbytes("(f32[8,128]{1,0:T(8,128)S(1)}, f32[8,128]{1,0})", hbm_only=True) == a
  m = hlo_lib.Module(_HLO_S1)
  by_name = {r["name"]: r["bytes"] for r in m.kernel_traffic(20)}
  assert by_name == {"cs": a, "two": 2 * a, "g": 2 * a, "t": 2 * a}, by_name
  assert m.hbm_bytes() == 7 * a
  every = hlo_lib.Module(_HLO_S1, hbm_only=False)
  assert every.hbm_bytes() == (2 + 3 + 3 + 3 + 2 + 2) * a
  assert {r["name"]: r["bytes"] for r in every.kernel_traffic(20)}["d"] == 2 * a


def test_targets_parse_and_collective_model():
  assert targets_lib.parse("v5e:16x16") == ("v5e", "16x16")
  with pytest.raises(targets_lib.TargetError, match="expected <chip>:<topology>"):
    targets_lib.parse("tpu-v5e-16")
  target = chips_lib.Target("h200:1x2x8", chips_lib.CHIPS["h200"], list(range(16)), 8, 141e9)
  # a ring all-reduce moves 2 (n - 1) / n of the bytes; across hosts at the NIC's 50 GB/s
  assert chips_lib.collective_seconds(target, "all-reduce", 1e9, 16) == pytest.approx(2 * 15 / 16 * 1e9 / 50e9)
  assert chips_lib.collective_seconds(target, "all-reduce", 1e9, 8) == pytest.approx(2 * 7 / 8 * 1e9 / 450e9)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu (pip install -e '.[plan-tpu]') "
                    "is not installed: the TPU compiler is an optional package")
def test_plan_compiles_for_tpu_v5e_without_hardware(tmp_path):
  config = tiny.write_train_config(str(tmp_path / "config.py"), "unused.txt", n_negative_samples=12,
                                   shard_softmax=True, **{"data.vocab_max_size": 300})
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  proc = subprocess.run([PYTHON, "-m", "elmo_jax", "plan", f"--config={config}", "--target=v5e:2x2",
                         "--per_device_batch=8", "--json"], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  r = json.loads(proc.stdout[proc.stdout.index("{"):])
  assert r["devices"] == 4 and r["chip"] == "TPU v5e" and r["fits"]
  assert r["hbm_bytes"]["capacity"] == 16 * 2**30
  assert abs(r["flops_per_token"] / r["analytic_train_flops_per_token"] - 1) < 0.10
  assert all(c["bytes"] < 1_000_000 for c in r["largest_collectives"] if c["op"] == "all-gather")


@pytest.mark.slow
def test_embed_step_plan_finds_the_largest_batch_that_fits():
  """`--step=embed` (here in process, on this process's one CPU device): the Embedder's own biLM step, its
  memory per device at the given batch and the largest power-of-two batch per time bucket: it fits the
  capacity beside the token table, twice as many rows would not (by the fitted bytes per row)."""
  from elmo_jax.plan import embed as embed_plan  # pylint: disable=g-import-not-at-top
  r = embed_plan.plan_embed(tiny.tiny_options(), "cpu:1", time_buckets=(8, 32), per_device_batch=4)
  assert r["devices"] == 1 and r["token_table_bytes"] == (2**15 + 1) * 6 * 4 and r["param_bytes"] > 0
  assert [b["time"] for b in r["buckets"]] == [8, 32]
  for b in r["buckets"]:
    rows = b["largest_rows_per_device"]
    assert b["fits_at_batch"] and rows & (rows - 1) == 0 and rows > 4
    assert b["hbm_bytes_at_largest"]["total"] <= r["hbm_capacity"] - r["token_table_bytes"]
    assert b["fixed_bytes"] + 2 * rows * b["bytes_per_row"] > 0.9 * (r["hbm_capacity"] - r["token_table_bytes"])
  assert r["buckets"][0]["bytes_per_row"] < r["buckets"][1]["bytes_per_row"]  # longer rows cost more
  assert "largest power of two that fits" in embed_plan.render(r)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu (pip install -e '.[plan-tpu]') "
                    "is not installed: the TPU compiler is an optional package")
def test_embed_step_plan_for_tpu_v5e(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  proc = subprocess.run([PYTHON, "-m", "elmo_jax", "plan", "--step=embed", "--model=small", "--target=v5e:2x2",
                         "--time_buckets=16", "--per_device_batch=8"], env=env, cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "v5e:2x2: 4 x TPU v5e, embed step of lstm 1024 -> 128" in proc.stdout
  assert "time bucket   16: 8 rows per device FIT" in proc.stdout and "largest power of two" in proc.stdout


# Issue 34: each bad flag of the planner is one line, before JAX starts or anything compiles (in process:
# the planning functions are replaced by ones that fail the test if reached).
@pytest.mark.parametrize("args, line", [
    (["--target=cpu:2x2"], "plan: error: --target=cpu:2x2: a cpu target is one device count, e.g. cpu:8"),
    (["--target=cpu:0"], "plan: error: --target=cpu:0: every axis of the topology must be a count >= 1, e.g. cpu:8"),
    (["--target=v5e:4x0"], "plan: error: --target=v5e:4x0: every axis of the topology must be a count >= 1"),
    (["--target=v4:4x4"], "plan: error: --target=v4:4x4: a TPU v4 slice has 3 axes of chips, e.g. v4:4x4x4"),
    (["--target=v5e:2x2x2"], "plan: error: --target=v5e:2x2x2: a TPU v5e slice has 2 axes of chips, e.g. v5e:4x4"),
    (["--target=h200:1x8"], "plan: error: --target=h200:1x8: GPU topologies are partitions x hosts x GPUs per host"),
    (["--step=embed", "--time_buckets=64,-3"], "plan: error: --time_buckets=64,-3: give token counts >= 1"),
    (["--step=embed", "--time_buckets="], "plan: error: --time_buckets=: give token counts >= 1"),
    (["--step=embed", "--per_device_batch=-1"], "plan: error: --per_device_batch must be >= 0, got -1"),
    (["--step=embed", "--model=huge"], "plan: error: --model=huge: unknown preset 'huge'"),
    (["--step=embed", "--dump_hlo=hlo.txt"], "plan: error: --dump_hlo is a flag of --step=train; --step=embed "
                                             "does not read it"),
    (["--step=embed", "--config.dropout=0.5"], "plan: error: --config.dropout is a flag of --step=train"),
    (["--model=small"], "plan: error: --model is a flag of --step=embed; --step=train does not read it"),
    (["--vocab_size=-5"], "plan: error: --vocab_size must be >= 0, got -5"),
    (["--vocab_size=3"], "plan: error: --vocab_size must hold <S>, </S>, <UNK> and a word (>= 4"),
    (["--per_device_batch=-2"], "plan: error: --per_device_batch must be >= 0, got -2"),
    (["--table_size=-1"], "plan: error: --table_size must be >= 0, got -1"),
    (["--launch_us=nan"], "plan: error: --launch_us must be a number >= 0, got nan"),
    (["--config.options.lstm.projection_dim=0"], "plan: error: config.options: lstm.projection_dim must be an "
                                                 "integer >= 1, got 0"),
    (["--config.dropout=1.0"], "plan: error: config.dropout=1.0: must be in [0, 1)"),
    (["--config.batch_size=0", "--config.dropout=2.0", "--per_device_batch=4"],  # the flag gives the batch
     "plan: error: config.dropout=2.0: must be in [0, 1)"),
    (["--config.batch_size=0"], "plan: error: config.batch_size=0 and config.per_device_batch_size=0: set one"),
    (["--dump_hlo=CONFIG"], "plan: error: --dump_hlo=CONFIG is an input of this run (CONFIG); writing it would "
                            "destroy it"),
    (["--config=TMP/no_such.py"], "FATAL Flags parsing error: --config=TMP/no_such.py: no such config file"),
    (["--config.dropot=0.5"], "FATAL Flags parsing error: unknown config key 'config.dropot'"),
])
def test_planner_flags_are_checked_before_any_compile(tmp_path, monkeypatch, args, line):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import train as plan_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.cli import plan as plan_cli  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import embed as embed_plan  # pylint: disable=g-import-not-at-top

  def compiled(*_, **__):
    raise AssertionError("compiled before the flags were checked")
  monkeypatch.setattr(plan_lib, "plan", compiled)
  monkeypatch.setattr(embed_plan, "plan_embed", compiled)
  monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as cli.run_main while the flags are parsed
  config = tmp_path / "config.py"
  config.write_text(open(os.path.join(REPO_ROOT, "configs", "default.py")).read())
  before = config.read_text()
  fill = lambda s: s.replace("CONFIG", str(config)).replace("TMP", str(tmp_path))  # noqa: E731
  args = [fill(a) for a in args]
  argv = ["plan", f"--config={config}", *args] if not any(a.startswith("--config=") for a in args) else ["plan", *args]
  if "--step=embed" in args:
    argv.remove(f"--config={config}")
  fv = flags.FlagValues()
  with pytest.raises(SystemExit) as e:
    plan_cli.define_flags(argv, fv)
    fv(argv)
    plan_cli.main(["plan"], fv)
  assert e.value.code.startswith(fill(line)), e.value.code
  assert "\n" not in e.value.code
  assert sorted(os.listdir(tmp_path)) == ["config.py"] and config.read_text() == before


def test_planner_embed_step_with_per_device_batch_zero_takes_the_default_rows(monkeypatch, capsys):
  """Issue 34 named `--per_device_batch=0 --step=embed` among the tracebacks: 0 is the default, the Embedder's
  128 rows per device (checked here up to the planning call, which is replaced: nothing compiles)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import train as plan_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.cli import plan as plan_cli  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import embed as embed_plan  # pylint: disable=g-import-not-at-top
  calls = []
  monkeypatch.setattr(embed_plan, "plan_embed", lambda *a, **kw: calls.append((a, kw)) or {"rows": a[3]})
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # main may add a device count: undone after
  argv = ["plan", "--step=embed", "--per_device_batch=0", "--model=small", "--target=cpu:1", "--json"]
  fv = flags.FlagValues()
  plan_cli.define_flags(argv, fv)
  fv(argv)
  from absl import logging  # pylint: disable=g-import-not-at-top
  verbosity = logging.get_verbosity()
  try:
    plan_cli.main(["plan"], fv)
  finally:
    logging.set_verbosity(verbosity)  # main quiets absl for the command
  (args, kw), = calls
  assert args[1:] == ("cpu:1", [64, 512], plan_lib.DEFAULT_ROWS) and kw == {"dtype": "float32"}
  assert json.loads(capsys.readouterr().out) == {"rows": 128}
