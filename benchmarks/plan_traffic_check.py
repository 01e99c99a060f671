"""The planner's HBM-traffic estimate against XLA's own cost analysis, where the compiler can judge it: on
loop-free programs (XLA's `bytes accessed` counts a while body once, so only unrolled code compares).

    PYTHONPATH=. .venv-plan/bin/python benchmarks/plan_traffic_check.py --target=v5e:2x2 --rows=128

Compiles, deviceless for one chip of `--target`, the forward + backward of lm1b's (configs/lm1b.py, bf16)
char CNN over a deduped token table and of its 2-layer biLSTM fully unrolled (`unroll` = unroll_steps: no
while loop), and prints the byte counts and their ratios per program, one JSON object: the estimate
(`estimate_bytes`: HBM only, arrays in TPU VMEM `S(1)` left out), the same counting every operand in any
memory space (`estimate_all_spaces_bytes`) and XLA's `bytes accessed`, which counts every operand too.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="v5e:2x2")
  parser.add_argument("--rows", type=int, default=128, help="batch rows per chip")
  args = parser.parse_args()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from configs import lm1b  # pylint: disable=g-import-not-at-top
  from elmo_jax.data import dedupe as dedupe_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.measure import hlo as hlo_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.model import BiLMConfig, BiLSTMStack, CharCNN  # pylint: disable=g-import-not-at-top
  from elmo_jax.plan import targets as targets_lib  # pylint: disable=g-import-not-at-top

  config = lm1b.get_config()
  cfg = BiLMConfig.from_options(options_lib.validate(config.options.to_dict(), "config.options"))
  dtype = jnp.dtype(config.dtype)
  device = targets_lib.make_target(args.target).devices[0]
  one = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dt=jnp.float32: jax.ShapeDtypeStruct(shape, dt, sharding=one)
  b, t = args.rows, int(config.unroll_steps)

  def compare(name, module, inputs, loss):
    params = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *inputs)["params"])
    params = jax.tree_util.tree_map(lambda p: spec(p.shape, p.dtype), params)
    step = jax.jit(jax.grad(lambda p, *x: loss(module.apply({"params": p}, *x))))
    compiled = step.lower(params, *(spec(x.shape, x.dtype) for x in inputs)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    text = compiled.as_text()
    m, every = hlo_lib.Module(text), hlo_lib.Module(text, hbm_only=False)
    est, est_all, xla = m.hbm_bytes(), every.hbm_bytes(), float(cost["bytes accessed"])
    return {"program": name, "loops": len(m.loops()), "estimate_bytes": est, "estimate_all_spaces_bytes": est_all,
            "xla_bytes_accessed": xla, "ratio": est / xla, "ratio_all_spaces": est_all / xla,
            "xla_byte_keys": {k: float(v) for k, v in cost.items() if "bytes" in k and "{" not in k},
            "largest_kernels": m.kernel_traffic(5)}

  # the deduped token table per chip, bucketed as the trainer (and the planner) do
  table = dedupe_lib.bucket_size(b * t // 2 + 1, cap=2 * b * t + 1)
  chars = jnp.zeros((table, cfg.max_characters_per_token), jnp.int32)
  out = [compare(f"char CNN, {table} tokens", CharCNN(cfg, dtype=dtype), (chars,),
                 lambda y: jnp.sum(y.astype(jnp.float32) ** 2))]
  x = jnp.zeros((b, t, cfg.projection_dim), jnp.float32)
  mask = jnp.ones((b, t), bool)
  out.append(compare(f"biLSTM {cfg.n_layers} layers, {b} rows x {t} steps, unrolled",
                     BiLSTMStack(cfg, dtype=dtype, unroll=t), (x, x, mask, mask),
                     lambda r: jnp.sum(r[0] ** 2) + jnp.sum(r[1][0]) + jnp.sum(r[1][1])))
  print(json.dumps({"target": args.target, "rows": b, "dtype": str(dtype), "programs": out}, indent=1))


if __name__ == "__main__":
  main()
