"""Pure Flax (linen) modules of ELMo. Nothing here imports data, training or I/O code."""
from elmo_jax.model.bilm import BiLM, make_model
from elmo_jax.model.char_cnn import CharCNN
from elmo_jax.model.config import BiLMConfig
from elmo_jax.model.elmo import Elmo, elmo_variables, embed_vocab, masked_mean, word_ids_for
from elmo_jax.model.lstm import BiLSTMStack, LSTMState, zero_state
from elmo_jax.model.scalar_mix import ScalarMix

__all__ = ["BiLM", "BiLMConfig", "BiLSTMStack", "CharCNN", "Elmo", "LSTMState", "ScalarMix", "elmo_variables",
           "embed_vocab", "make_model", "masked_mean", "word_ids_for", "zero_state"]
