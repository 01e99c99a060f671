"""Inputs that can be read once: a FIFO filled by a thread (a reader that opened it twice would find it empty
or wait forever the second time)."""
from __future__ import annotations

import os
import threading


def fifo(folder, data: bytes, name: str = "in.fifo") -> str:
  path = os.path.join(str(folder), name)
  os.mkfifo(path)

  def fill():
    with open(path, "wb") as f:
      f.write(data)
  threading.Thread(target=fill, daemon=True).start()
  return path
