"""Held-out perplexity of the biLM (bilm-tf's convention) and the unigram baseline.

Convention (bilm-tf's `_get_batch`): each sentence is `<S> w1..wn </S>`; the forward LM predicts
w1..wn and `</S>`, the backward LM predicts wn..w1 and `<S>`; n + 1 targets per sentence and direction.
The LSTM state is carried across windows within each batch row, as in training.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from elmo_jax.runtime import progress
from elmo_jax.data import Vocab

CONVENTION = ("each sentence is <S> w1..wn </S>; forward predicts w1..wn </S>, backward predicts "
              "wn..w1 <S> (n+1 targets per direction, bilm-tf); LSTM state carried across windows")


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
        batch = {key: np.zeros_like(value) for key, value in template.items()}  # all padding
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


def unigram_log_probs(vocab: Vocab) -> np.ndarray:
  """`[V]` natural-log unigram probabilities from the training counts.

  With no OOV in training `<UNK>` gets one count rather than probability 0 (an infinite perplexity).
  """
  log_probs = vocab.unigram_log_probs().copy()
  if not np.isfinite(log_probs[vocab.unk]):
    log_probs[vocab.unk] = -math.log(float(vocab.counts.sum()) + 1.0)
  return log_probs


def with_progress(batches, n_sentences: int, max_batches: int = 0, desc: str = "eval", disable: bool = False):
  """`batches` (an LM iterator with `counters`) under a progress bar: batches out of `max_batches`, else
  sentences read out of `n_sentences`."""
  if max_batches:
    return progress.track(batches, desc=desc, total=max_batches, unit="batch", disable=disable)
  return progress.track(batches, desc=desc, total=n_sentences, unit="sent", disable=disable,
                        count=lambda: batches.counters["sentences"])


class UnigramTally:
  """Passes LM batches through while scoring their forward targets with the unigram model.

  The baseline thus sees exactly the targets the biLM is scored on (same convention, same
  `max_batches` cut). Also counts the OOV share of words (`</S>` is a target but not a word).
  """

  def __init__(self, batches: Iterable[dict[str, np.ndarray]], vocab: Vocab):
    self._batches, self._vocab = batches, vocab
    self._log_probs = unigram_log_probs(vocab) if vocab.counts is not None else None
    self.nll, self.targets, self.words, self.oov = 0.0, 0, 0, 0

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    for batch in self._batches:
      targets = batch["fwd_targets"][batch["weights"] > 0]
      words = targets[targets != self._vocab.eos]
      self.targets += targets.size
      self.words += words.size
      self.oov += int(np.sum(words == self._vocab.unk))
      if self._log_probs is not None:
        self.nll -= float(np.sum(self._log_probs[targets]))
      yield batch

  def result(self) -> dict[str, Any]:
    """`unigram_ppl` (None without vocabulary counts), `oov_rate`, `n_words`."""
    ppl = math.exp(self.nll / max(self.targets, 1)) if self._log_probs is not None else None
    return {"unigram_ppl": ppl, "oov_rate": self.oov / max(self.words, 1), "n_words": self.words}


def unigram_baseline(vocab: Vocab, batches: Iterable[dict[str, np.ndarray]]) -> dict[str, Any]:
  """The unigram baseline alone, over a finite stream of LM batches (no model needed)."""
  tally = UnigramTally(batches, vocab)
  for _ in tally:
    pass
  return tally.result()
