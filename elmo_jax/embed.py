"""`python -m elmo_jax.embed`: the old form of `python -m elmo_jax embed` (`elmo-jax embed`), kept one release: it says
the new form on stderr, then runs it."""
if __name__ == "__main__":
  from elmo_jax import cli as _cli  # pylint: disable=g-import-not-at-top
  _cli.run_alias("elmo_jax.embed", "embed")
