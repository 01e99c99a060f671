"""What an evaluation reads and writes, so `--output_dir` is checked against its inputs before any work."""
from __future__ import annotations

import os

from elmo_jax.data.sources import split_paths
from elmo_jax.evaluation import readers
from elmo_jax.evaluation.config import EvalConfig
from elmo_jax.formats import efml
from elmo_jax.runtime import storage
from elmo_jax.runtime.run_layout import CONFIG_FILE, METRICS_FILE, VOCAB_COUNTS_FILE, VOCAB_FILE, export_files
from elmo_jax.sources import resolve

# What each task writes into the output directory (besides cache/), and `all`'s report.
WRITES = {"perplexity": ("perplexity.json", "perplexity_curves.png", "perplexity_bars.png"),
          "wsd": ("wsd.json", "wsd_layers.png", "wsd_pca.png"),
          "pos": ("pos.json", "pos_layers.png", "pos_mix.png"),
          "sentiment": ("sentiment.json", "sentiment_layers.png", "sentiment_mix.png"),
          "all": ("report.md",)}


def input_files(cfg: EvalConfig) -> list[str]:
  """Every file the evaluation reads: data, text, the model's options, weights and vocabulary (every file of
  an EFML folder; a workdir's export/, lexicon/, config and metrics too); TFDS inputs are no files."""
  ppl = cfg.perplexity
  paths = [cfg.wsd_file, cfg.wsd_train_file, cfg.pos_train_file, cfg.pos_test_file, cfg.sentiment_train_file,
           cfg.sentiment_test_file, ppl.options_file, ppl.weight_file, ppl.vocab_file]
  paths += split_paths(ppl.text_file or "")
  if ppl.weight_file:
    paths.append(os.path.join(os.path.dirname(ppl.weight_file), VOCAB_FILE))
  if ppl.options_file and efml.is_efml_dir(os.path.dirname(ppl.options_file)):  # every file of an EFML folder
    paths += resolve.folder_files(os.path.dirname(ppl.options_file))
  if ppl.model is not None:  # --model: every file of what it names
    paths += ppl.model.read_files
  if cfg.workdir:
    paths += [os.path.join(cfg.workdir, rel) for rel in (*export_files(), VOCAB_FILE, CONFIG_FILE, METRICS_FILE)]
    paths += resolve.resolve_model(cfg.workdir, use="run", fetch=False).read_files  # its lexicon/ too
  for vocab in [p for p in paths if p and os.path.basename(p) == VOCAB_FILE]:
    paths.append(os.path.join(os.path.dirname(vocab), VOCAB_COUNTS_FILE))
  return [p for p in paths if p and not readers.is_tfds(p)]


def check_output_dir(cfg: EvalConfig, names: list[str]) -> None:
  """`storage.check_output` of the output directory (a folder, writable, not an input, not in a trained
  run's checkpoints/ or export/) and of each file tasks `names` write there against the inputs, before
  any work. Raises `files.UnsafeOutputError` (one line)."""
  inputs = input_files(cfg)
  storage.check_output(cfg.output_dir, "--output_dir", inputs=inputs, directory=True)
  if os.path.isdir(cfg.output_dir):
    for name in [n for task in names for n in WRITES.get(task, ())]:
      storage.check_output(os.path.join(cfg.output_dir, name), "--output_dir", inputs=inputs)
