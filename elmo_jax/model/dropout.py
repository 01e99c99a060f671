"""Dropout whose mask depends on where an element sits in the global batch, not on how the batch is split.

`flax.linen.Dropout` draws `bernoulli(key, shape)` for the array it is given. Under `jax.jit` over a mesh
that array is the global batch and, with `jax_threefry_partitionable` (JAX's default), each element's
random bits are a hash of the key and the element's flat index in the global shape, so 8 devices and 1 draw
the same mask. Inside `jax.shard_map` every device sees only its own rows, and `nn.Dropout` would draw a mask
for the local shape: the same mask on every device, and another one for every device count.

`Dropout` here computes exactly the bits `nn.Dropout` draws for the global array, for the rows a device
holds: the counter of element (i, ..., b, ...) is its flat index in the global shape, with the batch axis
holding rows `rows_offset .. rows_offset + B` of `rows_total`. Same key (same module name and rng stream),
so with `rows=None` it equals `nn.Dropout` bit for bit (tests/model/test_model.py), and a sharded train step
draws the masks an unsharded one would.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.extend.random import threefry2x32_p

# (first row of this array in the global batch, rows of the global batch); None = this array is the batch.
Rows = tuple[Any, int] | None
_U32 = jnp.uint32


def _mul_wide(a: jax.Array, m: int) -> tuple[jax.Array, jax.Array]:
  """(high, low) 32-bit halves of the 64-bit product of uint32 `a` and a constant 0 <= m < 2**32."""
  m0, m1 = _U32(m & 0xFFFF), _U32(m >> 16)
  a0, a1 = a & _U32(0xFFFF), a >> _U32(16)
  p00, p01, p10, p11 = a0 * m0, a0 * m1, a1 * m0, a1 * m1
  mid = (p00 >> _U32(16)) + (p01 & _U32(0xFFFF)) + (p10 & _U32(0xFFFF))
  low = (p00 & _U32(0xFFFF)) + (mid << _U32(16))
  high = p11 + (p01 >> _U32(16)) + (p10 >> _U32(16)) + (mid >> _U32(16))
  return high, low


def global_bits(key: jax.Array, shape: tuple[int, ...], batch_axis: int, rows: Rows) -> jax.Array:
  """uint32 bits [shape]: `jax.random.bits(key, global_shape)` at this array's rows (partitionable threefry).

  `global_shape` is `shape` with `rows[1]` rows on `batch_axis`; this array holds rows `rows[0]` on.
  """
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.key_data(key)
  n_rows = shape[batch_axis]
  offset, total = rows if rows is not None else (0, n_rows)
  pre, post = shape[:batch_axis], shape[batch_axis + 1:]
  inner = math.prod(post)
  if total * math.prod(pre) >= 2**32 or inner >= 2**32:
    raise ValueError(f"dropout over a global shape with {total} rows of {shape} is too large")
  # Row r of the flattened leading axes: its index among all leading-axis x global rows.
  lead = jnp.arange(math.prod(pre), dtype=_U32).reshape(pre + (1,)) * _U32(total)
  row = lead + jnp.asarray(offset).astype(_U32) + jnp.arange(n_rows, dtype=_U32)
  row = row.reshape(row.shape + (1,) * len(post))
  high, low = _mul_wide(row, inner)
  within = jnp.arange(inner, dtype=_U32).reshape(post)
  low_sum = low + within
  high = high + (low_sum < low).astype(_U32)  # carry
  high, low_sum = jnp.broadcast_arrays(high, low_sum)
  bits_hi, bits_lo = threefry2x32_p.bind(key[0], key[1], high, low_sum)
  return bits_hi ^ bits_lo


class Dropout(nn.Module):
  """`nn.Dropout(rate)` with the mask of the global batch (see the module docstring).

  Attributes:
    rate: the probability of dropping an element.
  """
  rate: float
  rng_collection: str = "dropout"

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool, rows: Rows = None, batch_axis: int = 0) -> jax.Array:
    """x with elements dropped and the rest scaled by 1 / (1 - rate); `rows` places x's `batch_axis`
    in the global batch."""
    if self.rate == 0.0 or deterministic:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    keep_prob = 1.0 - self.rate
    bits = global_bits(self.make_rng(self.rng_collection), x.shape, batch_axis, rows)
    # jax.random.uniform's float32 from 32 bits: 23 mantissa bits under exponent 0, minus 1.
    one = np.array(1.0, np.float32).view(np.uint32)
    uniform = jax.lax.bitcast_convert_type((bits >> _U32(9)) | _U32(one), jnp.float32) - 1.0
    keep = uniform < jnp.float32(keep_prob)
    return jax.lax.select(keep, x / keep_prob, jnp.zeros_like(x))
