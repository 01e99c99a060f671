"""`runtime.memory.freeze_loaded_objects`: a server's loaded objects out of the cyclic collector's full passes."""
from __future__ import annotations

import inspect
import subprocess
import sys

from paths import REPO_ROOT

_CHECK = """
import gc
from elmo_jax.runtime import memory
held = [[k] for k in range(1000)]  # live containers, tracked by the collector
before = gc.get_freeze_count()
frozen = memory.freeze_loaded_objects()
assert frozen == gc.get_freeze_count() and frozen >= before + len(held), (before, frozen)
assert not any(o is held for o in gc.get_objects())  # frozen: no generation holds it any more
print("ok")
"""


def test_freeze_moves_the_live_objects_out_of_the_collectors_reach_and_serve_calls_it():
  # in a process of its own: a freeze lasts for the process (and an interpreter may have frozen objects already)
  out = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, cwd=REPO_ROOT, check=False)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
  from elmo_jax.cli import serve  # pylint: disable=g-import-not-at-top
  source = inspect.getsource(serve.main)
  assert source.index("memory.freeze_loaded_objects()") < source.index('print(f"ready:')  # before it is ready
