"""`python -m elmo_jax.data.prepare`: the old form of `python -m elmo_jax prepare` (`elmo-jax prepare`), kept one release: it says
the new form on stderr, then runs it."""
if __name__ == "__main__":
  from elmo_jax import cli as _cli  # pylint: disable=g-import-not-at-top
  _cli.run_alias("elmo_jax.data.prepare", "prepare")
