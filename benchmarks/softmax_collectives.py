"""Collective bytes per train step, read from the compiled HLO on 8 simulated CPU devices; one JSON object.

    PYTHONPATH=. python benchmarks/softmax_collectives.py [--config=lm1b] [--devices=8]

Compiles (never runs: abstract shapes, no memory) the data-parallel train step of a config and sums the
operand bytes of every all-reduce / all-gather / reduce-scatter / all-to-all in the optimized HLO, split
into the softmax (`[V, P]` / `[V]` shaped) and the rest. With replicated params the softmax gradient is
all-reduced densely every step, whatever rows the sampled softmax touched.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

_parser = argparse.ArgumentParser()
_parser.add_argument("--config", default="lm1b")
_parser.add_argument("--devices", type=int, default=8)
_parser.add_argument("--shard_softmax", type=int, default=0, help="1: the softmax split over the mesh")
_parser.add_argument("--batch_size", type=int, default=0, help="0 = the config's")
ARGS = _parser.parse_args()
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ARGS.devices}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from elmo_jax.model import make_model  # noqa: E402
from elmo_jax.training import step as step_lib  # noqa: E402

_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "pred": 1, "u8": 1, "s8": 1}
_COLLECTIVE = re.compile(r"^\s*(?:ROOT\s+)?\S+\s*=\s*(.+?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all)"
                         r"(?:-start)?\(")
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")


def collectives(hlo: str, vocab: int) -> dict:
  out = {"softmax_bytes": 0, "other_bytes": 0, "ops": {}}
  for line in hlo.splitlines():
    m = _COLLECTIVE.match(line)
    if not m:
      continue
    kind = m.group(2)
    for dtype, dims in _SHAPE.findall(m.group(1)):
      if dtype not in _BYTES:
        continue
      shape = [int(d) for d in dims.split(",") if d]
      size = int(np.prod(shape)) * _BYTES[dtype] if shape else _BYTES[dtype]
      key = "softmax_bytes" if shape and shape[0] == vocab else "other_bytes"
      out[key] += size
      out["ops"][kind] = out["ops"].get(kind, 0) + size
  return out


def main():
  import importlib.util  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  spec = importlib.util.spec_from_file_location("cfg", os.path.join(root, "configs", f"{ARGS.config}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  config = mod.get_config()
  if ARGS.batch_size:
    config.batch_size = ARGS.batch_size
  vocab = int(config.data.vocab_max_size)
  options = config.options.to_dict()
  mesh = step_lib.make_mesh()
  model = make_model(options, dropout=config.dropout, dtype=config.dtype, unroll=config.get("scan_unroll", 1))
  optimizer = step_lib.make_optimizer(config)
  create = lambda: step_lib.create_train_state(model, optimizer, vocab, config.batch_size, config.seed)
  abstract = jax.eval_shape(create)
  shardings = step_lib.state_shardings(abstract, mesh, shard_softmax=bool(ARGS.shard_softmax))
  num_sampled = config.n_negative_samples if 0 < config.n_negative_samples < vocab - 1 else 0
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
  b, u, c = config.batch_size, config.unroll_steps, options["char_cnn"]["max_characters_per_token"]
  n_dev = len(mesh.devices.reshape(-1))
  table = 512  # a typical deduped table per device at 128 x 20 rows per device; only its shape matters here
  batch = {"token_chars": jax.ShapeDtypeStruct((n_dev, table, c), jnp.int32),
           "fwd_index": jax.ShapeDtypeStruct((b, u), jnp.int32), "bwd_index": jax.ShapeDtypeStruct((b, u), jnp.int32),
           "fwd_targets": jax.ShapeDtypeStruct((b, u), jnp.int32), "bwd_targets": jax.ShapeDtypeStruct((b, u), jnp.int32),
           "weights": jax.ShapeDtypeStruct((b, u), jnp.float32)}
  state = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings)
  hlo = train_step.lower(state, batch).compile().as_text()
  result = collectives(hlo, vocab)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(abstract.params))
  softmax_params = vocab * (options["lstm"]["projection_dim"] + 1)
  total = result["softmax_bytes"] + result["other_bytes"]
  print(json.dumps({"config": ARGS.config, "shard_softmax": bool(ARGS.shard_softmax), "devices": n_dev, "global_batch": b, "vocab": vocab,
                    "num_sampled": num_sampled, "params": n_params, "softmax_params": softmax_params,
                    "collective_bytes_per_step": total, "softmax_collective_bytes": result["softmax_bytes"],
                    "softmax_share": round(result["softmax_bytes"] / max(total, 1), 4),
                    "by_op": result["ops"]}, indent=1))


if __name__ == "__main__":
  main()
