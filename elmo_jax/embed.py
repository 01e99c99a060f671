"""`python -m elmo_jax.embed`: the embedding command, an alias of `elmo_jax.cli.embed` (`elmo-jax-embed`).

The work is `elmo_jax.embedding` (`Embedder`, `writer.embed_file`).
"""
if __name__ == "__main__":
  from elmo_jax.cli import embed as _cli  # pylint: disable=g-import-not-at-top
  __doc__ = _cli.__doc__  # absl's --help prints the __main__ module's docstring: the command's usage
  _cli.run()
