"""What the benchmarks share: the measured matmul peak (MFU denominator) and peak RSS."""
from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def matmul_peak(n: int = 2048, reps: int = 10) -> float:
  """Best FLOP/s of an n x n float32 matmul (jit, XLA:CPU's Eigen/oneDNN path)."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best
