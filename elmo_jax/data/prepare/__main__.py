"""`python -m elmo_jax.data.prepare`: the corpus-preparing command, an alias of `elmo_jax.cli.prepare`.

A package `__main__` (as `elmo_jax.plan`'s), so the work in `elmo_jax.data.prepare` never imports the command.
"""
if __name__ == "__main__":
  from elmo_jax.cli import prepare as _cli  # pylint: disable=g-import-not-at-top
  __doc__ = _cli.__doc__  # absl's --help prints the __main__ module's docstring: the command's usage
  _cli.run()
