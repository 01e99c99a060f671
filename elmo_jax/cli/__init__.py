"""Every command: train, evaluate, embed, prepare, plan, downstream, convert (console scripts `elmo-jax-train`,
`elmo-jax-evaluate`, `elmo-jax-embed`, `elmo-jax-plan`, `elmo-jax-downstream`, `elmo-jax-convert`). `train.py`,
`evaluate.py` and `python -m elmo_jax.{embed,plan,downstream,convert,data.prepare}` are thin aliases of these
modules."""
import functools
import math
import os
import sys
from typing import Callable

from absl import app
from absl import flags

from elmo_jax.runtime import memory


def default_config(name: str = "default") -> str:
  """`configs/NAME.py` of the working directory, else of the source tree this package sits in."""
  local = os.path.join("configs", f"{name}.py")
  if os.path.exists(local):
    return local
  tree = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", f"{name}.py")
  return tree if os.path.exists(tree) else local


def command_name() -> str:
  """How the running command was invoked, for its error lines: `elmo_jax.embed` (`python -m`), `evaluate.py`,
  `elmo-jax-embed` (a console script)."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name:
    return spec.name.removesuffix(".__main__")
  return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "elmo_jax"


def usage_error_line(name: str, error: app.UsageError) -> str:
  """A usage error as one line (absl would print the module's docstring, tens of lines, before it)."""
  message = " ".join(str(error).split()) or "bad usage"
  return f"{name}: error: {message} (--help for usage)"


def _one_line_usage_errors(main: Callable, name: str | None, dont_write_bytecode: bool) -> Callable:
  @functools.wraps(main)
  def wrapped(argv):
    sys.dont_write_bytecode = dont_write_bytecode  # the flags are parsed: the config file is loaded
    try:
      return main(argv)
    except app.UsageError as e:
      print(usage_error_line(name or command_name(), e), file=sys.stderr)
      sys.exit(e.exitcode if e.exitcode else 2)
  return wrapped


def run_main(main: Callable, define_flags: Callable[[], None] | None = None, name: str | None = None) -> None:
  """Every command's start: glibc keeps freed memory for XLA's buffers (first, before JAX allocates; see
  elmo_jax/runtime/memory.py), then the command's flags where it defines them only when run, then absl. A usage
  error (`app.UsageError`) from `main` is one line, `NAME: error: MESSAGE (--help for usage)`, exit code
  its `exitcode` (1 by default); `name` defaults to how the command was invoked (`command_name`). While the
  flags are defined and parsed, which loads a `--config=FILE`, Python writes no bytecode: a user's config folder
  gets no `__pycache__` from a command that only reads it."""
  memory.reuse_freed_memory()
  dont_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
  if define_flags is not None:
    define_flags()
  app.run(_one_line_usage_errors(main, name, dont_write_bytecode))


def define_distributed_flags() -> None:
  """The multi-process flags of the commands that run on many hosts (train, embed)."""
  flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                    "Call jax.distributed.initialize: 'auto' when --coordinator_address is given or a cluster "
                    "(TPU pod, SLURM, Open MPI) is detected; 'on' always (JAX detects the cluster); 'off' never.")
  flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0's coordinator (multi-process runs).")
  flags.DEFINE_integer("num_processes", None, "Number of processes (with --coordinator_address).")
  flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
  flags.DEFINE_float("distributed_timeout_s", 300, "Seconds to wait for every process to connect to the "
                     "coordinator; then one line naming the coordinator and the process ids waited for, exit 1 "
                     "(a line says what is awaited after 3 s).")


def check_flag_numbers(error: type[Exception], at_least=(), within=()) -> None:
  """Counts and rates of a command's flags, before any work: one line naming the flag, raised as `error`.
  `at_least`: (flag holder, lowest value) pairs; `within`: (flag holder, "in [0, 1)", predicate) triples."""
  for flag, low in at_least:
    if flag.value is not None and flag.value < low:
      raise error(f"--{flag.name} must be >= {low}, got {flag.value}")
  for flag, want, ok in within:
    if not (math.isfinite(flag.value) and ok(flag.value)):
      raise error(f"--{flag.name} must be {want}, got {flag.value}")
