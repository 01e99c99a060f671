"""Inputs that can be read once: a FIFO filled by a thread (a reader that opened it twice would find it empty
or wait forever the second time)."""
from __future__ import annotations

import os
import threading


def fifo(folder, data: bytes, name: str = "in.fifo") -> str:
  path = os.path.join(str(folder), name)
  os.mkfifo(path)

  def fill():
    try:
      with open(path, "wb") as f:
        f.write(data)
    except BrokenPipeError:  # the reader stopped early (a refusal from the first block, a bounded spool)
      pass
  threading.Thread(target=fill, daemon=True).start()
  return path
