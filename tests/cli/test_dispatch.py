"""One way to start every command: the console script `elmo-jax <command>` (`elmo_jax.cli.main`; `python -m
elmo_jax <command>` is the same); the old `python -m elmo_jax.embed`-style aliases are gone."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from paths import REPO_ROOT

from elmo_jax import cli

COMMANDS = ["train", "evaluate", "embed", "prepare", "plan", "convert", "push", "downstream", "serve"]


def _listed(text: str) -> dict[str, str]:
  """`--help`'s command lines: name -> its one line."""
  return {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()
          if line.startswith("  ") and len(line.split()) > 1}


def _flags(text: str) -> list[str]:
  """The `--name` of each flag entry a command's `--help` lists (`  --name: ...`, `  --[no]name: ...`)."""
  return [line.split(":")[0].strip().replace("[no]", "") for line in text.splitlines() if line.startswith("  --")]


# A flag each command must list (defined at run time by its define_flags, or at import by its module).
_A_FLAG = {"train": "--workdir", "evaluate": "--task", "embed": "--output_file", "prepare": "--output_dir",
           "plan": "--config", "convert": "--to", "push": "--to", "downstream": "--task", "serve": "--max_batch_tokens"}


@pytest.mark.slow  # ten command processes
def test_every_command_help_lists_its_flags_and_exits_0():
  """One process per command (evaluate and downstream both define --task at import: not in one process)."""
  env = {**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"}
  for command in COMMANDS:
    proc = subprocess.run([sys.executable, "-m", "elmo_jax", command, "--help"], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=300)
    assert proc.returncode == 0, (command, proc.stderr[-2000:])
    listed = _flags(proc.stdout)
    assert _A_FLAG[command] in listed and "--helpfull" not in listed, (command, proc.stdout)
    assert len(listed) == len(set(listed)), proc.stdout  # a short name does not list its flag twice
    assert proc.stdout.index("flags:") > 0, proc.stdout  # the command's docstring first
  table = subprocess.run([sys.executable, "-m", "elmo_jax", "downstream", "table", "--help"], capture_output=True,
                         text=True, cwd=REPO_ROOT, env=env, timeout=300)
  assert table.returncode == 0 and "--output: Directory for downstream.md" in table.stdout, table.stdout


def test_help_lists_every_command_on_one_line(capsys):
  with pytest.raises(SystemExit) as done:
    cli.main(["elmo-jax", "--help"])
  assert done.value.code == 0
  out = capsys.readouterr().out
  assert list(_listed(out)) == COMMANDS, out
  assert all(len(line) < 100 for line in out.splitlines()), out


@pytest.mark.parametrize("argv,want", [
    (["elmo-jax"], "usage: elmo-jax <command>"),
    (["elmo-jax", "bogus"], "elmo-jax: error: unknown command 'bogus'; one of train, evaluate, embed, prepare, plan, "
                            "convert, push, downstream, serve (--help for usage)"),
])
def test_no_or_unknown_command_exits_2(argv, want, capsys):
  with pytest.raises(SystemExit) as done:
    cli.main(argv, prog="elmo-jax")
  assert done.value.code == 2
  err = capsys.readouterr().err
  assert err.splitlines()[0] == want or err.startswith(want), err


def test_python_m_elmo_jax_and_console_script_list_the_commands():
  runs = [[sys.executable, "-m", "elmo_jax", "--help"]]
  if shutil.which("elmo-jax"):  # installed by scripts/test.sh's set-up (pyproject's [project.scripts])
    runs.append([shutil.which("elmo-jax"), "--help"])
  for argv in runs:
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT})
    assert proc.returncode == 0 and list(_listed(proc.stdout)) == COMMANDS, (argv, proc.stdout, proc.stderr)


@pytest.mark.slow  # a command process (it imports its command's module)
def test_command_help_and_no_old_form_alias():
  env = {**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"}
  helped = subprocess.run([sys.executable, "-m", "elmo_jax", "convert", "--help"], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=300)
  assert helped.returncode == 0, helped.stderr[-2000:]
  assert "elmo-jax convert --from=" in helped.stdout  # the command's own docstring (one form), then its flags
  assert {"--from", "--to", "--format"} <= set(_flags(helped.stdout)), helped.stdout
  for old in ("elmo_jax.embed", "elmo_jax.convert", "elmo_jax.plan.__main__", "elmo_jax.downstream.__main__",
              "elmo_jax.data.prepare.__main__"):
    assert importlib.util.find_spec(old) is None, old  # the old `python -m elmo_jax.embed`-style forms are gone


def test_install_page_shows_what_help_prints():
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO_ROOT, "docs", "install.md"), encoding="utf-8") as f:
    block = re.search(r"```text\n(usage: elmo-jax.*?)\n```", f.read(), re.S).group(1)
  assert cli.usage().startswith(block) and list(_listed(block)) == COMMANDS, block
