"""Deadlines for waits that Python cannot interrupt: a save stuck in tensorstore's native code or in a socket
to a bucket that stopped answering, `jax.distributed.initialize` blocked in XLA's coordination client.

`exit_after(seconds, line)` starts a timer thread; if the returned `cancel` is not called in time, the process
writes `line` to stderr and ends with exit code 1 (`os._exit`: the thread that hangs can neither be joined nor
raised into, and interpreter shutdown would wait for it). Only for a process whose files are safe to leave at
any moment: every file is written to a temporary name and renamed, every save is an Orbax step that is either
committed or ignored by the next restore.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

EXIT_CODE = 1


def exit_after(seconds: float, line: str | Callable[[], str], *, notice_after_s: float | None = None,
               notice: str | Callable[[], str] | None = None, name: str = "deadline") -> Callable[[], bool]:
  """Ends the process with `line` after `seconds` unless the returned `cancel()` is called first.

  `notice` (if given) is written to stdout after `notice_after_s` seconds, while still waiting: what the
  process waits for, long before it gives up. `cancel()` returns whether the notice was written. Lines are
  strings or callables (evaluated when written, e.g. to name the last good checkpoint at that moment).
  """
  done = threading.Event()
  noticed = threading.Event()

  def text(value) -> str:
    return value() if callable(value) else value

  def watch() -> None:
    start = time.monotonic()
    if notice is not None and notice_after_s is not None and notice_after_s < seconds:
      if done.wait(notice_after_s):
        return
      noticed.set()
      print(text(notice), flush=True)
    if done.wait(max(seconds - (time.monotonic() - start), 0)):
      return
    sys.stdout.flush()
    os.write(2, (" ".join(text(line).split()) + "\n").encode())  # one line, however the message was built
    os._exit(EXIT_CODE)

  threading.Thread(target=watch, daemon=True, name=name).start()

  def cancel() -> bool:
    done.set()
    return noticed.is_set()

  return cancel
