"""A tiny TFDS dataset in glue/sst2's layout, built locally (nothing downloaded)."""
from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds


def _rows(rng: np.random.Generator, n: int) -> list[tuple[str, int]]:
  filler = ["movie", "plot", "actor", "story", "film", "scene"]
  rows = []
  for _ in range(n):
    label = int(rng.integers(2))
    words = list(rng.choice(filler, size=3)) + [
        rng.choice(["good", "great", "fine"] if label else ["bad", "awful", "dull"])]
    rng.shuffle(words)
    rows.append((" ".join(words) + ".", label))
  return rows


class TinySst2(tfds.core.GeneratorBasedBuilder):
  """glue/sst2's layout: sentence, label (ClassLabel), idx; plus an unlabelled test split."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, disable_shuffling=True,
        features=tfds.features.FeaturesDict({
            "sentence": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["negative", "positive"]),
            "idx": np.int32}))

  def _split_generators(self, dl_manager):
    rng = np.random.default_rng(0)
    return {"train": self._generate_examples(_rows(rng, 120)),
            "validation": self._generate_examples(_rows(rng, 40)),
            "test": self._generate_examples([("no label here.", -1)])}

  def _generate_examples(self, rows):
    for i, (sentence, label) in enumerate(rows):
      yield i, {"sentence": sentence, "label": label, "idx": i}
