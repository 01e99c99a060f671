"""`python -m elmo_jax <command> [flags]`: every command (train, evaluate, embed, prepare, plan, convert, serve,
downstream) started one way; `python -m elmo_jax --help` lists them. The console script `elmo-jax` is the same
dispatcher (`elmo_jax.cli.main`)."""
if __name__ == "__main__":
  from elmo_jax import cli  # pylint: disable=g-import-not-at-top
  cli.main()
