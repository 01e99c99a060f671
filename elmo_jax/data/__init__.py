"""Training data: text (or TFDS, or a prepared corpus) into type ids and bilm-tf-style LM batches.

Names are loaded on first use (PEP 562), so `elmo_jax.data.chars` or `elmo_jax.data.vocab` alone do not
import Grain and TFDS.
"""
import importlib

_NAMES = {"LMIterator": "batches", "make_lm_iterator": "pipeline", "TextSource": "sources",
          "TfdsSource": "sources", "Tokenizer": "tokenize", "Vocab": "vocab"}

__all__ = sorted(_NAMES)


def __getattr__(name):
  if name in _NAMES:
    return getattr(importlib.import_module(f"elmo_jax.data.{_NAMES[name]}"), name)
  raise AttributeError(f"module 'elmo_jax.data' has no attribute {name!r}")
