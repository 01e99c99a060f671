"""`python -m elmo_jax convert`: the conversion command (`elmo_jax.cli.convert`; the work:
`elmo_jax.interop.convert`)."""
