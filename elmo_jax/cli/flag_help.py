"""A command's `--help`: its docstring and every flag it defines, on stdout, exit 0.

absl's own `--help` lists only the flags of the module named by `sys.argv[0]` (none: the commands define their
flags at run time, from `elmo_jax.cli.*`, and `sys.argv[0]` is `elmo-jax embed`) and exits 1; so `run_main`
answers `--help` here, after the command's flags are defined and before absl parses anything."""
from __future__ import annotations

import sys
from typing import Iterable

from absl import flags

HELP_ARGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")


def wants_help(argv: list[str]) -> bool:
  """Whether the command line asks for help (before a `--`, after which arguments are not flags)."""
  args = argv[1:]
  if "--" in args:
    args = args[:args.index("--")]
  return any(a in HELP_ARGS for a in args)


def command_flags(module: str, defined: Iterable[str]) -> list[flags.Flag]:
  """The flags a command owns: those its module defines at import, and those its `define_flags` added
  (`defined`: their names), sorted by name; absl's own (--help, --logtostderr, ...) are left out."""
  values = flags.FLAGS
  owned = {f.name: f for f in values.flags_by_module_dict().get(module, [])}
  owned.update({values[name].name: values[name] for name in defined})  # short names too
  return [owned[name] for name in sorted(owned)]


def flag_lines(flag: flags.Flag) -> list[str]:
  """`  --name: help (default: D)` wrapped to 100 columns."""
  text = flag.help or ""  # an enum's help starts with its choices, `<a|b>: `
  if flag.default is not None:
    text += f" (default: {flag.default_as_str})"
  prefix = f"--{flag.name}" if flag.flag_type() != "bool" else f"--[no]{flag.name}"
  return flags.text_wrap(f"{prefix}: {text}", length=100, indent="      ", firstline_indent="  ").splitlines()


def print_help(module: str, defined: Iterable[str], doc: str | None) -> None:
  """The command's docstring, then `flags:` and one entry per flag; exits 0."""
  out = [(doc or f"usage: {sys.argv[0]} [flags]").rstrip(), "", "flags:"]
  for flag in command_flags(module, defined):
    out += flag_lines(flag)
  print("\n".join(out))
  sys.exit(0)
