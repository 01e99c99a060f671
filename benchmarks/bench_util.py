"""What the benchmarks share: the measured matmul peak (MFU denominator), peak RSS, real sentences, latency
percentiles."""
from __future__ import annotations

import gzip
import resource
import time
from typing import Any, Callable, Sequence

import numpy as np


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def memory_mb(pid: int | str = "self") -> dict[str, float]:
  """A process's resident memory now (`rss`, of which `anon` is heap/arrays, `file` mapped code) and its
  peak so far (`hwm`), from /proc/PID/status (Linux; default: this process); {} elsewhere."""
  keys = {"VmRSS": "rss", "VmHWM": "hwm", "RssAnon": "anon", "RssFile": "file"}
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
      lines = [line.split(":") for line in f if line.split(":")[0] in keys]
  except OSError:
    return {}
  return {keys[k]: round(int(v.split()[0]) / 1024, 1) for k, v in lines}


def matmul_peak(n: int = 2048, reps: int = 10) -> float:
  """Best FLOP/s of an n x n float32 matmul (jit, XLA:CPU's Eigen/oneDNN path)."""
  import jax  # pylint: disable=g-import-not-at-top  (here: a baseline's process that reads its memory has no jax)
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
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


def load_sentences(path: str, n: int, max_len: int = 512) -> list[list[str]]:
  """The first `n` non-empty lines of `path` of at most `max_len` tokens, whitespace-tokenized."""
  opener = gzip.open if path.endswith(".gz") else open
  out = []
  with opener(path, "rt", encoding="utf-8") as f:
    for line in f:
      tokens = line.split()
      if 0 < len(tokens) <= max_len:
        out.append(tokens)
        if len(out) == n:
          break
  return out


def stats(ms: Sequence[float]) -> dict[str, float]:
  a = np.asarray(ms)
  p50 = float(np.percentile(a, 50))
  return {"p50": round(p50, 2), "p95": round(float(np.percentile(a, 95)), 2),
          "p99": round(float(np.percentile(a, 99)), 2), "max": round(float(a.max()), 2),
          "mean": round(float(a.mean()), 2), "max_over_p50": round(float(a.max()) / p50, 2)}


def clock(fn: Callable[[], Any]) -> float:
  """Milliseconds `fn()` takes."""
  start = time.perf_counter()
  fn()
  return (time.perf_counter() - start) * 1e3
