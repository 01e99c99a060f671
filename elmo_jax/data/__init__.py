"""Training data: tokenizer, vocabulary, sentence sources and bilm-tf-style LM batches."""
from elmo_jax.data.pipeline import LMIterator, make_lm_iterator
from elmo_jax.data.sources import TextSource, TfdsSource
from elmo_jax.data.tokenize import Tokenizer
from elmo_jax.data.vocab import Vocab

__all__ = ["LMIterator", "TextSource", "TfdsSource", "Tokenizer", "Vocab", "make_lm_iterator"]
