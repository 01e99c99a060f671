"""Continue training a released ELMo on your own text: the model's options come from `config.init_from`.

    elmo-jax train --config=configs/finetune.py --config.init_from=SOURCE \
        --config.data.train_files=my.txt.gz --config.data.eval_files=my_valid.txt.gz --workdir=runs/mine

SOURCE is anything init_from reads: a run, its checkpoints or a step, options.json + weights.hdf5 (bilm-tf,
AllenNLP, an NLPL archive), an ELMoForManyLangs folder (its char.dic and word.dic are the run's lexicons), a
TF-Hub `elmo/3` module folder, a released name, a URL or an archive. The options below are placeholders: every
one is taken from the source (`training/variant.py`); one set here must equal the source's, else the run is
refused in one line naming it, before anything is written. The releases ship no softmax (EFML, TF-Hub,
AllenNLP): a new one is trained on this text's vocabulary, alone for the first `freeze_bilm_steps` steps
(the biLM and EFML's word embedding frozen, bit for bit), then with everything. The export is in the
source's format (`export_format`: EFML folder for an EFML source, bilm-tf's hdf5 otherwise).
"""
import ml_collections
from ml_collections.config_dict import placeholder

from elmo_jax.training.config import base_config


def _options() -> ml_collections.ConfigDict:
  """Every shape key of options.json, unset (None, typed): the source's values fill them."""
  return ml_collections.ConfigDict({
      "lstm": {"dim": placeholder(int), "n_layers": placeholder(int), "projection_dim": placeholder(int),
               "cell_clip": placeholder(float), "proj_clip": placeholder(float),
               "use_skip_connections": placeholder(bool)},
      "char_cnn": {"embedding": {"dim": placeholder(int)}, "n_highway": placeholder(int),
                   "max_characters_per_token": placeholder(int), "activation": placeholder(str)},
  })


def get_config():
  c = base_config()
  c.options = _options()
  c.init_from = placeholder(str)
  c.freeze_bilm_steps = 200  # the new softmax settles before its gradients reach the pretrained biLM
  c.batch_size = 32
  c.num_train_steps = 2000
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.log_every_steps = 25
  c.optimizer = "adam"
  c.learning_rate = 1e-3
  c.data.vocab_max_size = 50_000
  c.data.vocab_min_count = 2
  c.data.train_files = ""
  c.data.eval_files = ""
  return c
