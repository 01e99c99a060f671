"""Task models with ELMo (Peters et al. 2018, Table 1): a BiLSTM POS tagger and a sentiment classifier,
trained without ELMo (baseline), with a frozen biLM's scalar mix, or fine-tuning the biLM.
Entry point: `elmo-jax downstream` (`elmo_jax/cli/downstream.py`); the side-by-side table: `table.py`."""
