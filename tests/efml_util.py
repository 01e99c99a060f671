"""A tiny ELMoForManyLangs model folder: random weights in EFML's own modules (needs torch and the
elmoformanylangs package), saved as its releases are (config.json, char.dic, word.dic, two torch.save files)."""
from __future__ import annotations

import json
import os

# The tiny shape: every option of the released cnn_50_100_512_4096_sample architecture, small.
ARCHITECTURE = {
    "encoder": {"name": "elmo", "projection_dim": 8, "cell_clip": 3, "proj_clip": 3, "dim": 16, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu", "filters": [[1, 4], [2, 4], [3, 8]], "n_highway": 2,
                       "word_dim": 6, "char_dim": 5, "max_characters_per_token": 12},
    "classifier": {"name": "sampled_softmax", "n_samples": 8192},
    "dropout": 0.1,
}
# EFML's char.dic / word.dic hold the specials among the entries (ids in file order); U+3000 is the
# entry whose line strip() turns into the id alone.
CHARS = ["<oov>", "<pad>", "<bos>", "<eos>", "<bow>", "<eow>", "\u3000", *"abcdefghij", "é", "中", "文", "."]
WORDS = ["<oov>", "<pad>", "<bos>", "<eos>", "abc", "中文", "fig", "."]
SENTENCES = [["abc", "中文", "."], ["fig", "héllo", "abcdefghijabcdefg", "中", "zzz"], ["."],
             ["<bos>", "ab", "cd", "ef", "gh", "ij", "abc", "abc", "ji"]]


def write_model(folder: str, *, zip_format: bool, seed: int = 0, architecture_file: bool = True) -> None:
  """Builds EFML's `Model` with random weights (all of them, biases too) and writes the folder."""
  import torch  # pylint: disable=g-import-not-at-top
  from elmoformanylangs.frontend import Model  # pylint: disable=g-import-not-at-top
  from elmoformanylangs.modules.embedding_layer import EmbeddingLayer  # pylint: disable=g-import-not-at-top

  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"config_path": "../configs/tiny.json"}, f)  # EFML also looks up the file name in the folder
  if architecture_file:
    with open(os.path.join(folder, "tiny.json"), "w") as f:
      json.dump(ARCHITECTURE, f)
  for name, vocab in (("char.dic", CHARS), ("word.dic", WORDS)):
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
      f.writelines(f"{token}\t{i}\n" for i, token in enumerate(vocab))
  torch.manual_seed(seed)
  emb = ARCHITECTURE["token_embedder"]
  words = EmbeddingLayer(emb["word_dim"], {w: i for i, w in enumerate(WORDS)}, fix_emb=False)
  chars = EmbeddingLayer(emb["char_dim"], {c: i for i, c in enumerate(CHARS)}, fix_emb=False)
  model = Model(ARCHITECTURE, words, chars, use_cuda=False)
  with torch.no_grad():
    for p in model.parameters():
      p.uniform_(-0.6, 0.6)
  for part in ("token_embedder", "encoder"):
    torch.save(getattr(model, part).state_dict(), os.path.join(folder, f"{part}.pkl"),
               _use_new_zipfile_serialization=zip_format)
