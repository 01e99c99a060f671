"""Every command: train, evaluate, embed, prepare, plan, convert, push, downstream, serve, started one way: the
console script `elmo-jax <command>`, through `main` here (`python -m elmo_jax <command>`, `elmo_jax/__main__.py`,
is the same). In a clone, `train.py` and `evaluate.py` are the thin top-level entry points of the first two."""
import contextlib
import functools
import math
import os
import signal
import sys
from typing import Callable, Iterator

from absl import app
from absl import flags

from elmo_jax.cli import flag_help
from elmo_jax.runtime import memory


def default_config(name: str = "default") -> str:
  """`configs/NAME.py` of the working directory, else of the source tree this package sits in."""
  local = os.path.join("configs", f"{name}.py")
  if os.path.exists(local):
    return local
  tree = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "configs", f"{name}.py")
  return tree if os.path.exists(tree) else local


# name -> (module with `run()`, the one line `--help` shows). The modules import on demand: `--help` is instant.
COMMANDS = {
    "train": ("elmo_jax.cli.train", "train an ELMo biLM from a config (configs/*.py) into a workdir; reruns resume"),
    "evaluate": ("elmo_jax.cli.evaluate", "perplexity and probing tasks (wsd, pos, sentiment) of a run or model"),
    "embed": ("elmo_jax.cli.embed", "a file of sentences into an HDF5 file of ELMo layers (AllenNLP's layout)"),
    "prepare": ("elmo_jax.cli.prepare", "tokenize a large corpus once into shards + vocabulary for training"),
    "plan": ("elmo_jax.cli.plan", "will a config fit a TPU slice or GPU cluster, how fast (compiles without it)"),
    "convert": ("elmo_jax.cli.convert",
                "a model into bilm-tf's hdf5, EFML, safetensors, or its forward pass (StableHLO, ONNX)"),
    "push": ("elmo_jax.cli.push", "a safetensors model folder (convert's) to a Hugging Face Hub repository"),
    "downstream": ("elmo_jax.cli.downstream", "a task model (POS, sentiment) with ELMo; `downstream table` sums up runs"),
    "serve": ("elmo_jax.cli.serve", "an HTTP server of ELMo (KServe v2 and OpenAI embeddings), batched and warm"),
}
_invoked_as: str | None = None  # "elmo-jax embed" while `main` runs a command: its error lines' name


def usage() -> str:
  """The dispatcher's `--help`: one line per command."""
  width = max(map(len, COMMANDS))
  lines = ["usage: elmo-jax <command> [flags]   (python -m elmo_jax <command>: the same)", "", "commands:"]
  lines += [f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items()]
  lines += ["", "`elmo-jax <command> --help` lists a command's flags.",
            "In a clone, `python train.py` and `python evaluate.py` are train and evaluate."]
  return "\n".join(lines)


def _prog() -> str:
  """`elmo_jax` under `python -m elmo_jax`, else the console script's name (`elmo-jax`)."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name == "elmo_jax.__main__":
    return "elmo_jax"
  name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  return name if name and not name.endswith(".py") else "elmo-jax"


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
  """`elmo-jax <command> [flags]`: runs the command's `run()` with `sys.argv` as if it were started alone
  (absl parses it; its `--help` prints the command's docstring). `--help` alone lists the commands (exit 0); no
  command or an unknown one is one line on stderr, exit 2."""
  global _invoked_as
  argv = list(sys.argv if argv is None else argv)
  prog = prog or _prog()
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help", "--helpfull"):
    print(usage(), file=sys.stdout if len(argv) >= 2 else sys.stderr)
    sys.exit(0 if len(argv) >= 2 else 2)
  command, rest = argv[1], argv[2:]
  if command not in COMMANDS:
    print(f"{prog}: error: unknown command {command!r}; one of {', '.join(COMMANDS)} (--help for usage)",
          file=sys.stderr)
    sys.exit(2)
  import importlib  # pylint: disable=g-import-not-at-top
  module_name = COMMANDS[command][0]
  if command == "downstream" and rest[:1] == ["table"]:  # the settings side by side, over finished runs
    module_name, command, rest = "elmo_jax.cli.downstream_table", "downstream table", rest[1:]
  module = importlib.import_module(module_name)
  _invoked_as = f"{prog} {command}"
  sys.argv = [_invoked_as, *rest]
  main_module = sys.modules.get("__main__")
  if main_module is not None:
    main_module.__doc__ = module.__doc__  # absl's --help prints the __main__ module's docstring
  module.run()


def command_name() -> str:
  """How the running command was invoked, for its error lines: `elmo_jax embed` (`python -m elmo_jax embed`),
  `elmo-jax embed` (the console script), `evaluate.py`."""
  if _invoked_as is not None:
    return _invoked_as
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
    except MemoryError as e:  # past every reader's own checks: one line, not a traceback
      print(f"{name or command_name()}: error: out of memory ({' '.join(str(e).split())[:160] or 'MemoryError'}); "
            "a smaller --batch_size or model, or a machine with more memory", file=sys.stderr, flush=True)
      sys.exit(1)
    except KeyboardInterrupt:  # e.g. during a first (uncached) load; commands that save on Ctrl-C catch it first
      print(f"{name or command_name()}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
      sys.stdout.flush()
      # At once: XLA's compile and loader threads may still run, and an interpreter shutdown under them can
      # crash (a segmentation fault after the traceback); every `finally` has run on the way up here.
      os._exit(130)
  return wrapped


@contextlib.contextmanager
def exit_on_interrupt(name: str | None = None) -> Iterator[None]:
  """Within it, Ctrl-C (SIGINT) ends the process at once in one line and exit 130: for a phase with nothing to
  save (a server's load). A KeyboardInterrupt raised while Python runs a finalizer (an array's `__del__`, a weakref
  callback: many during a load that compiles) is printed as ignored and lost, and the process went on to serve."""
  def interrupted(signum, frame):  # pylint: disable=unused-argument
    print(f"{name or command_name()}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    os._exit(130)
  previous = signal.signal(signal.SIGINT, interrupted)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)


def run_main(main: Callable, define_flags: Callable[[], None] | None = None, name: str | None = None) -> None:
  """Every command's start: glibc keeps freed memory for XLA's buffers (first, before JAX allocates; see
  elmo_jax/runtime/memory.py), then the command's flags where it defines them only when run, then absl. A usage
  error (`app.UsageError`) from `main` is one line, `NAME: error: MESSAGE (--help for usage)`, exit code
  its `exitcode` (1 by default); Ctrl-C that reaches it is one line, exit 130; `name` defaults to how the command was invoked (`command_name`). `--help`
  lists the command's flags, exit 0 (`flag_help`). While the flags are defined and parsed, which loads a `--config=FILE`, Python writes no bytecode: a user's config folder
  gets no `__pycache__` from a command that only reads it."""
  memory.reuse_freed_memory()
  dont_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
  before = set(flags.FLAGS)
  if define_flags is not None:
    define_flags()
  if flag_help.wants_help(sys.argv):  # absl's would list none of them and exit 1
    module = getattr(getattr(main, "func", main), "__module__", "__main__")
    flag_help.print_help(module, set(flags.FLAGS) - before, getattr(sys.modules.get(module), "__doc__", None))
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
