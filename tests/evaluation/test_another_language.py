"""README "Another language" at a tiny size: a biLM trained on Turkish (data/tr-twt-tiny, the committed slice
of the Turkish Web Treebank that benchmarks/another_language.py made) beats the unigram baseline, and that
script's reading of the treebank (inflectional groups joined into words)."""
from __future__ import annotations

import gzip
import json
import os
import sys

import pytest

from paths import REPO_ROOT
from tiny import train_config

sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
import another_language  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

SLICE = os.path.join(REPO_ROOT, "data", "tr-twt-tiny")

_CONLLU = """# sent_id = tr-blog:1
# text = Açıklanmayan soru imkansız.
1\tAçık\taçık\tNOUN\tNN\t_\t2\tig\t_\tSpaceAfter=No
2\tla\t_\tVERB\tVB\t_\t3\tig\t_\tSpaceAfter=No
3\tnmayan\t_\tADJ\tVJ\t_\t4\trcmod\t_\t_
4\tsoru\tsoru\tNOUN\tNN\t_\t6\tnsubj\t_\t_
5\timkan\timkan\tNOUN\tNN\t_\t6\tig\t_\tSpaceAfter=No
6\tsız\t_\tVERB\tNOMP\t_\t0\troot\t_\tSpaceAfter=No
7\t.\t.\tPUNCT\t.\t_\t6\tp\t_\t_
"""


def test_treebank_words_are_joined_groups_tagged_by_the_last():
  (sentence,) = another_language.read_conllu(_CONLLU)
  assert sentence["id"] == "tr-blog:1" and sentence["text"] == "Açıklanmayan soru imkansız."
  assert sentence["words"] == [("Açıklanmayan", "ADJ"), ("soru", "NOUN"), ("imkansız", "VERB"), (".", "PUNCT")]
  stats = another_language.byte_limit_stats([{"text": "ğ" * 24 + " " + "ğ" * 25 + " a"}])
  assert stats["cut_at_50"] == 1 and stats["tokens"] == 3 and stats["max_bytes"] == 50  # 48 bytes are kept


@pytest.mark.slow
def test_turkish_bilm_beats_unigram(tmp_path):
  from elmo_jax.training.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  with gzip.open(os.path.join(SLICE, "train.txt.gz"), "rt", encoding="utf-8") as f:
    text = f.read()
  assert len(text.splitlines()) == 400 and all(c in text for c in "çğıöşü")  # Turkish, not ASCII
  c = train_config(os.path.join(SLICE, "train.txt.gz"), os.path.join(SLICE, "valid.txt.gz"), **{
      "num_train_steps": 300, "eval_every_steps": 300, "checkpoint_every_steps": 300, "log_every_steps": 50,
      "batch_size": 16, "learning_rate": 1e-2, "optimizer": "adam", "n_negative_samples": 0,
      "data.pretokenized": False, "data.vocab_min_count": 2, "unroll_steps": 20})
  train_and_evaluate(c, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  (base,) = [r for r in rows if "unigram_ppl" in r]
  last = [r for r in rows if "eval_ppl" in r][-1]
  assert last["step"] == 300 and 0.5 < base["oov_rate"] < 0.7  # Turkish: many words seen once
  assert last["eval_ppl"] < 0.9 * base["unigram_ppl"], (last, base)
