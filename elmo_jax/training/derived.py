"""One rule for what a training start derives into its workdir: it is the run's only while a checkpoint holds
the run.

A start writes, before its first step, what it derives from its config, its data and its `init_from`:
`vocab.txt` (+ counts; `input._run_vocab`), an EFML-style run's lexicons `lexicon/{char,word}.dic`
(`variant.lexicon` / `variant.save_lexicon`) and `config.json` with the model's options (what
`configs/finetune.py` took from its source; `variant.resolve`). A start that died before its first checkpoint
left them behind as guesses of another config or text: the next start in that workdir derives them again from
its own and replaces them (saying so), and reads them back only to resume a checkpoint. The auto-prepared
corpus (`prepared/<key>/`) follows the same rule by its name: `key` hashes its inputs and settings, so another
text or setting is prepared anew, and the same one resumes its verified chunks.
"""
from __future__ import annotations

import os

from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import CHECKPOINTS
from elmo_jax.training import checkpoint


def held(checkpoints: str) -> bool:
  """Whether a checkpoint holds the run whose checkpoints folder (local or a bucket's) is `checkpoints`."""
  return checkpoint.newest_meta(checkpoints) is not None


def kept(local: str, name: str, checkpoints: str | None = None) -> str | None:
  """`local/name` (a derived file or folder of the workdir `local`) where it exists and a checkpoint holds the
  run (`checkpoints`: default `local/checkpoints`; a bucket workdir's are in the bucket), else None: without a
  checkpoint it is an earlier start's, derived again."""
  path = os.path.join(local, name)
  if not os.path.exists(path):
    return None
  return path if held(checkpoints or storage.join(local, CHECKPOINTS)) else None
