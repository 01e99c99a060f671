"""`python -m elmo_jax.downstream`: the task-model command, an alias of `elmo_jax.cli.downstream`."""
if __name__ == "__main__":
  from elmo_jax.cli import downstream as _cli  # pylint: disable=g-import-not-at-top
  __doc__ = _cli.__doc__  # absl's --help prints the __main__ module's docstring: the command's usage
  _cli.run()
