"""`train.py` for the fault tests: with `ELMO_JAX_TEST_SIGNAL_AT_STEP=N:KILL` (or `N:TERM`) the run sends
itself SIGKILL (SIGTERM) once step N is logged and saved and every pending save (and a bucket workdir's
upload) is done, instead of a test racing a sleep-paced run with a timed kill. A test-only wrapper: the
loop only offers the hook (`train_and_evaluate(after_step=)`)."""
import os
import signal

from elmo_jax.cli import train

ENV = "ELMO_JAX_TEST_SIGNAL_AT_STEP"


def signal_self_at(spec: str):
  at, name = spec.split(":")

  def after_step(step: int, flush) -> None:
    if step == int(at):
      flush()
      os.kill(os.getpid(), getattr(signal, f"SIG{name}"))

  return after_step


if __name__ == "__main__":
  train.run(after_step=signal_self_at(os.environ[ENV]) if os.environ.get(ENV) else None)
