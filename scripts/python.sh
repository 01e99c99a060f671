# Sourced by scripts/env.sh, plan.sh and .ci/run: which Python to build a venv with, and which lock goes with it.
#   elmo_python NAME     prints a working interpreter for NAME (python3, python3.12, /path/to/python): NAME itself
#                        when it runs; else, for pythonX.Y, pyenv's installed X.Y (the newest patch), since a pyenv
#                        shim refuses a version that is installed but not selected; nothing (status 1) if none.
#   elmo_lock PY         sets LOCK (the requirements file) and VENV (its folder) for interpreter PY:
#                        3.11 -> requirements.txt in .venv (jax 0.10.2, the last jax for 3.11);
#                        3.12+ -> requirements-py312.txt in .venv-py3XX (the newest jax; tested on 3.12).
elmo_python() {
  local name="$1" root v
  if "$name" -c 'import sys' >/dev/null 2>&1; then command -v "$name" 2>/dev/null || echo "$name"; return 0; fi
  case "$name" in
    python3.[0-9]*) v="${name#python}";;
    *) return 1;;
  esac
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  for cand in $(ls -d "$root"/versions/"$v".* 2>/dev/null | sort -V -r); do
    if "$cand/bin/python$v" -c 'import sys' >/dev/null 2>&1; then echo "$cand/bin/python$v"; return 0; fi
  done
  return 1
}

elmo_lock() {
  local minor
  minor="$("$1" -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else 0)')"
  if [ "$minor" -ge 12 ]; then
    LOCK=requirements-py312.txt VENV=".venv-py3$minor"
  else
    LOCK=requirements.txt VENV=.venv
  fi
}
