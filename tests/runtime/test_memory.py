"""`runtime.memory.freeze_loaded_objects`: a server's loaded objects out of the cyclic collector's full passes."""
from __future__ import annotations

import gc
import inspect

from elmo_jax.runtime import memory


def test_freeze_moves_the_live_objects_out_of_the_collectors_reach_and_serve_calls_it():
  held = [[k] for k in range(1000)]  # live containers, tracked by the collector
  assert gc.get_freeze_count() == 0
  try:
    frozen = memory.freeze_loaded_objects()
    assert frozen == gc.get_freeze_count() and frozen > len(held)
    assert not gc.get_objects(generation=2) or all(o is not held for o in gc.get_objects(generation=2))
  finally:
    gc.unfreeze()  # the rest of the suite's process stays as it was
  assert gc.get_freeze_count() == 0
  from elmo_jax.cli import serve  # pylint: disable=g-import-not-at-top
  source = inspect.getsource(serve.main)
  assert source.index("memory.freeze_loaded_objects()") < source.index("sock.listen(")  # before it is ready
