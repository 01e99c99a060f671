"""`python -m elmo_jax.plan`: the planning command, an alias of `elmo_jax.cli.plan` (`elmo-jax-plan`).

The planning itself is `elmo_jax.plan` (`plan`, `plan.embed.plan_embed`).
"""
if __name__ == "__main__":
  from elmo_jax.cli import plan as _cli  # pylint: disable=g-import-not-at-top
  __doc__ = _cli.__doc__  # absl's --help prints the __main__ module's docstring: the command's usage
  _cli.run()
