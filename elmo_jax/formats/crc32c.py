"""crc32c (Castagnoli), and masked as TensorFlow and LevelDB store it next to the data it covers (`mask`).

google-crc32c's C code where installed (the gcs extra), else a table implementation: byte by byte in Python for
small inputs, numpy lanes combined for large ones (~50 MB/s).
"""
from __future__ import annotations

import numpy as np

_MASK_DELTA = 0xa282ead8


def _table() -> list[int]:
  """The register after each byte value (reflected polynomial 0x82F63B78)."""
  out = []
  for n in range(256):
    c = n
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    out.append(c)
  return out


_CRC_TABLE = _table()

try:
  import google_crc32c as _fast  # pylint: disable=g-import-not-at-top  (the gcs extra's C implementation)
  if getattr(_fast, "implementation", "c") != "c":
    _fast = None
except ImportError:  # pragma: no cover - depends on the install
  _fast = None


def _update(reg: int, data: bytes) -> int:
  """The crc register after `data`, byte by byte (pure Python, ~3 MB/s: for small inputs)."""
  table = _CRC_TABLE
  for b in data:
    reg = table[(reg ^ b) & 0xFF] ^ (reg >> 8)
  return reg


def _apply(cols: np.ndarray, v: np.ndarray) -> np.ndarray:
  """A linear map of crc registers (GF(2)), given by the images `cols` [32] of the 32 bits, applied to `v`."""
  out = np.zeros_like(v)
  for bit in range(32):
    out ^= cols[bit] * ((v >> np.uint32(bit)) & np.uint32(1))
  return out


def _zeros(n: int) -> np.ndarray:
  """The map of `n` zero bytes on the register (what a register becomes when n zero bytes follow)."""
  cols = np.uint32(1) << np.arange(32, dtype=np.uint32)
  table = np.asarray(_CRC_TABLE, np.uint32)
  for _ in range(n):
    cols = table[cols & np.uint32(0xFF)] ^ (cols >> np.uint32(8))
  return cols


def _update_lanes(reg: int, data: bytes, lanes: int = 1 << 16) -> int:
  """`_update` for large inputs with numpy: `lanes` equal chunks side by side from a zero register, then
  combined pairwise (the crc is linear: crc(A B) = zeros(len B)(crc(A)) ^ crc(B), zlib's crc32_combine);
  the remainder byte by byte. ~50 MB/s (20x the pure-Python rate); `lanes` a power of 2."""
  length = len(data) // lanes
  head = np.frombuffer(data, np.uint8, count=lanes * length).reshape(lanes, length).T.copy()
  table = np.asarray(_CRC_TABLE, np.uint32)
  crcs = np.zeros(lanes, np.uint32)
  for column in head:
    crcs = table[(crcs ^ column) & np.uint32(0xFF)] ^ (crcs >> np.uint32(8))
  shift = _zeros(length)
  while len(crcs) > 1:  # pairs of neighbours: the left one shifted past the right one's bytes
    crcs = _apply(shift, crcs[0::2]) ^ crcs[1::2]
    shift = _apply(shift, shift)  # twice the length
  reg = int(_apply(shift, np.asarray([reg], np.uint32))[0] ^ crcs[0])
  return _update(reg, data[lanes * length:])


def crc32c(data: bytes, crc: int = 0) -> int:
  """crc32c of `data`, extending `crc` (the unmasked value of the bytes before)."""
  if _fast is not None:
    return _fast.extend(crc, bytes(data))
  data = bytes(data)
  reg = crc ^ 0xFFFFFFFF
  reg = _update_lanes(reg, data) if len(data) >= 1 << 20 else _update(reg, data)
  return reg ^ 0xFFFFFFFF


def mask(crc: int) -> int:
  """TensorFlow's `crc32c::Mask`: a crc stored next to the data it covers is rotated and offset."""
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF
