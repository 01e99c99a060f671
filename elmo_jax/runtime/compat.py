"""What differs between the jax versions elmo_jax supports (0.10.2 to the newest; pyproject.toml): the one place
that knows, so the rest of the code spells each thing one way.

- XLA flags: XLA aborts the process on a flag it does not know ("F ... Unknown flag in XLA_FLAGS"), and flags
  come and go between releases (`--xla_cpu_use_fusion_emitters` is gone after jaxlib 0.10). `known_xla_flags`
  asks the running jaxlib in a child process, once per jaxlib version, and remembers the answer.
- Which `shard_map` axes a value varies over: jax 0.10 keeps them in `aval.mat.varying`, later versions name
  them `aval.vma` (`varying_axes`); `pcast_varying` is the one spelling of the cast to device-varying.
Imports no jax at module level: tests/conftest.py calls `known_xla_flags` before JAX creates its CPU client.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile

XLA_FLAGS_CACHE = "xla_flags.json"  # {"jaxlib VERSION": {flag: known}} in the caller's cache folder
_UNKNOWN = re.compile(r"Unknown flags? in XLA_FLAGS: (.*)")


def jaxlib_version() -> str:
  """The installed jaxlib's version, read from its metadata (no import of jax, no backend)."""
  return importlib.metadata.version("jaxlib")


def version_tuple(version: str) -> tuple[int, ...]:
  """'0.12.0.1' -> (0, 12, 0, 1); a local or dev suffix ('0.11.2+cuda', '0.12.1.dev0') is dropped."""
  return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0].split(".dev")[0]))


def known_xla_flags(flags: tuple[str, ...] | list[str], cache_dir: str) -> tuple[str, ...]:
  """The flags among `flags` ("--name=value") that the installed jaxlib's XLA accepts, in their order.

  The first call for a jaxlib version starts a child Python that creates a CPU client with all of them (a few
  seconds; again without each flag XLA reports unknown); the answer is kept in `cache_dir/xla_flags.json`."""
  path = os.path.join(cache_dir, XLA_FLAGS_CACHE)
  key = f"jaxlib {jaxlib_version()}"
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError):
    saved = {}
  known = saved.get(key, {})
  missing = [f for f in flags if f not in known]
  if missing:
    known.update(_probe(missing))
    saved[key] = known
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=cache_dir, suffix=".tmp", delete=False) as f:  # never half-written
      json.dump(saved, f, indent=1, sort_keys=True)
    os.replace(f.name, path)
  return tuple(f for f in flags if known.get(f))


def _probe(flags: list[str]) -> dict[str, bool]:
  """{flag: whether XLA accepts it}: a CPU client created under the remaining flags until none is refused."""
  known, left = {}, list(flags)
  while left:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(left)}
    done = subprocess.run([sys.executable, "-c", "import jax; jax.devices('cpu')"], env=env, capture_output=True,
                          text=True, timeout=300)
    if done.returncode == 0:
      known.update(dict.fromkeys(left, True))
      break
    named = {word for m in _UNKNOWN.finditer(done.stderr) for word in m.group(1).split()}
    unknown = {f for f in left if f in named}
    if not unknown:  # refused for another reason: none is used rather than every later process aborting
      known.update(dict.fromkeys(left, False))
      break
    known.update(dict.fromkeys(unknown, False))
    left = [f for f in left if f not in unknown]
  return known


def varying_axes(x) -> frozenset:
  """The `shard_map` axes `x` varies over (empty outside one). jax 0.10 keeps them in `aval.mat.varying`;
  later versions also name them `aval.vma`."""
  import jax  # pylint: disable=g-import-not-at-top
  aval = jax.typeof(x)
  vma = getattr(aval, "vma", None)
  return frozenset(vma if vma is not None else getattr(getattr(aval, "mat", None), "varying", ()))


def pcast_varying(x, axes):
  """`x` cast to vary over the `shard_map` axes `axes` (a name or a tuple): a replicated value whose gradient
  must come out per device, or a buffer a loop carries beside varying updates."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.lax.pcast(x, axes, to="varying")
