"""An ELMoForManyLangs-style model for a new language, from scratch: its char lexicon (code points, with
EFML's special entries and ids) and word lexicon are built from the training text (`data/lexicon.py`), and
the run exports an EFML release folder that EFML's `Embedder` loads (and ours: `--model=WORKDIR`).

    elmo-jax train --config=configs/efml.py --config.data.train_files=tr/train.txt.gz \
        --config.data.eval_files=tr/valid.txt.gz --workdir=runs/tr_efml

EFML's shape (`cnn_50_100_512_4096_sample`: char dim 50, word dim 100, 7 filters, 2 highways, 2 x 4096 LSTM
projected to 512) scaled to a CPU run as `configs/default.py` is; `--config.options.lstm.dim=4096` etc. give
the released size. The lexicon sizes and the sentence boundaries' ids are filled in when the run starts
(`training/variant.py`); a resume reads the workdir's lexicons back.
"""
import ml_collections

from elmo_jax.training.config import base_config


def get_config():
  c = base_config()
  c.options = ml_collections.ConfigDict({
      "char_cnn": {"activation": "relu", "embedding": {"dim": 16},
                   "filters": [[1, 32], [2, 32], [3, 64], [4, 64], [5, 64]], "n_highway": 2,
                   "max_characters_per_token": 50, "highway": "allennlp",
                   "char_vocab_size": 0, "word_embedding": {"n_words": 0, "dim": 32},  # sizes: from the lexicon
                   "special_ids": [[0], [0]]},
      "lstm": {"dim": 256, "n_layers": 2, "projection_dim": 64, "cell_clip": 3.0, "proj_clip": 3.0,
               "use_skip_connections": True, "implicit_forget_bias": False},
  })
  c.data.lexicon = "build"
  c.data.pretokenized = False
  c.data.vocab_max_size = 20_000  # the softmax's and word.dic's words
  c.data.vocab_min_count = 2
  c.batch_size = 32
  c.num_train_steps = 2000
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.log_every_steps = 25
  c.optimizer = "adam"
  c.learning_rate = 4e-3
  c.n_negative_samples = 0
  return c
