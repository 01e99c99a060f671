"""`python -m elmo_jax.embed`: the embedding command, an alias of `elmo_jax.cli.embed` (`elmo-jax-embed`).

The work is `elmo_jax.embedding` (`Embedder`, `writer.embed_file`).
"""
if __name__ == "__main__":
  from elmo_jax.cli import embed as _cli  # pylint: disable=g-import-not-at-top
  _cli.run()
