"""`python -m elmo_jax.convert`: the conversion command, an alias of `elmo_jax.cli.convert` (`elmo-jax-convert`).

The work is `elmo_jax.interop.convert`.
"""
if __name__ == "__main__":
  from elmo_jax.cli import convert as _cli  # pylint: disable=g-import-not-at-top
  __doc__ = _cli.__doc__  # absl's --help prints the __main__ module's docstring: the command's usage
  _cli.run()
