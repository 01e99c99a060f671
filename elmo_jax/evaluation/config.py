"""What an evaluation is asked to do (`EvalConfig`): its data files, output folder and the probe and perplexity
settings. Read by the tasks (`tasks.py`) and by the output checks (`outputs.py`)."""
from __future__ import annotations

import dataclasses

from elmo_jax.evaluation import perplexity, probes


@dataclasses.dataclass
class EvalConfig:
  output_dir: str
  workdir: str | None = None
  wsd_file: str | None = None
  wsd_train_file: str | None = None
  wsd_lemma: str | None = None  # lemma for the PCA plot (default: most frequent)
  pos_train_file: str | None = None
  pos_test_file: str | None = None
  sentiment_train_file: str | None = None
  sentiment_test_file: str | None = None
  # Sentiment files may be `tfds:NAME:SPLIT` (readers.read_tfds_labelled); None keys: auto.
  tfds_data_dir: str | None = None
  tfds_text_key: str | None = None
  tfds_label_key: str | None = None
  max_examples: int | None = None  # cap on sentences/rows per file (first N)
  batch_size: int = 64
  use_cache: bool = True
  probe: probes.ProbeConfig = dataclasses.field(default_factory=probes.ProbeConfig)
  perplexity: perplexity.PerplexityConfig = dataclasses.field(
      default_factory=perplexity.PerplexityConfig)
