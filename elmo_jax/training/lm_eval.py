"""Held-out perplexity of the biLM (bilm-tf's convention) and the unigram baseline.

Convention (bilm-tf's `_get_batch`): each sentence is `<S> w1..wn </S>`; the forward LM predicts
w1..wn and `</S>`, the backward LM predicts wn..w1 and `<S>`; n + 1 targets per sentence and direction.
The LSTM state is carried across windows within each batch row, as in training.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import jax
import numpy as np
from jax.experimental import multihost_utils

from elmo_jax.data import Tokenizer, Vocab

CONVENTION = ("each sentence is <S> w1..wn </S>; forward predicts w1..wn </S>, backward predicts "
              "wn..w1 <S> (n+1 targets per direction, bilm-tf); LSTM state carried across windows")


def _zero_like(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k: np.zeros_like(v) for k, v in batch.items()}


def perplexity(eval_step: Callable, params: Any, zero_lstm_state: Any, batches: Iterable[dict[str, np.ndarray]],
               to_global: Callable, max_batches: int = 0) -> dict[str, float]:
  """Runs `eval_step` over a finite stream of LM batches; returns perplexities and the token count.

  With several processes, a process whose shard ran out keeps feeding all-padding batches until every
  process is done, so the collectives inside the step stay matched.
  """
  sums = {"nll_forward": 0.0, "nll_backward": 0.0, "n_tokens": 0.0}
  lstm_state = zero_lstm_state
  iterator = iter(batches)
  template = None
  n = 0
  while not max_batches or n < max_batches:
    batch = next(iterator, None)
    if batch is not None and template is None:
      template = batch
    if jax.process_count() > 1:
      flags = multihost_utils.process_allgather(np.array([batch is not None]))
      if not np.any(flags):
        break
      if batch is None:
        if template is None:
          raise RuntimeError("this process's eval shard is empty; use fewer processes or more eval data")
        batch = _zero_like(template)
    elif batch is None:
      break
    lstm_state, out = eval_step(params, lstm_state, to_global(batch))
    for k in sums:
      sums[k] += float(out[k])
    n += 1
  count = max(sums["n_tokens"], 1.0)
  nll_f, nll_b = sums["nll_forward"] / count, sums["nll_backward"] / count
  return {"ppl_forward": math.exp(nll_f), "ppl_backward": math.exp(nll_b), "ppl": math.exp(0.5 * (nll_f + nll_b)),
          "n_tokens": int(sums["n_tokens"])}


def unigram_perplexity(vocab: Vocab, tokenizer: Tokenizer, sentences: Iterable[str]) -> dict[str, float]:
  """Perplexity of the word-frequency model from the training counts over the forward targets.

  Also the OOV rate (share of words, `</S>` excluded, mapped to `<UNK>`).
  """
  log_probs = vocab.unigram_log_probs().copy()
  if not np.isfinite(log_probs[vocab.unk]):  # no OOV in training: give <UNK> one count, not probability 0
    log_probs[vocab.unk] = -math.log(float(vocab.counts.sum()) + 1.0)
  total, n, oov, words = 0.0, 0, 0, 0
  for text in sentences:
    tokens = tokenizer(text)
    if not tokens:
      continue
    ids = vocab.encode(tokens)
    oov += int(np.sum(ids == vocab.unk))
    words += len(ids)
    targets = np.concatenate([ids, [vocab.eos]])
    total += float(-np.sum(log_probs[targets]))
    n += len(targets)
  return {"unigram_ppl": math.exp(total / max(n, 1)), "oov_rate": oov / max(words, 1), "n_words": words}
