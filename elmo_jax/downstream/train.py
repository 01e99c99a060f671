"""Trains and evaluates one task model (one task, one ELMo setting, one seed); writes `results.json`.

Read top to bottom: read the splits -> vocabularies -> (frozen) biLM layers of every sentence, computed
once -> jit-compiled Adam steps over length-bucketed batches -> dev accuracy per epoch, early stopping ->
test accuracy of the best-dev epoch's params -> results.json + dev-curve plot.

Frozen ELMo trains only the task model and the scalar mixes, so the biLM's output for a sentence never
changes: it is computed once (`Embedder`, stateless) and kept in memory (float16 by default, see
`cache_dtype`), which is exact up to that rounding and makes seeds and epochs cheap; with
`layer_cache_dir` the layers also go to disk (`features.cached`, keyed by the biLM's weights hash and the
exact sentences), so the other seeds' runs skip the biLM entirely.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.downstream import data as data_lib
from elmo_jax.downstream.model import TaskConfig, TaskModel, init_params
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.evaluation import early_stopping, features, probes, readers
from elmo_jax.runtime import files
from elmo_jax.runtime.progress import progress
from elmo_jax.runtime.run_layout import CONFIG_FILE
from elmo_jax.sources import resolve
from elmo_jax.training import init_from
from elmo_jax.training.freeze import bilm_labels

ELMO_SETTINGS = ("none", "frozen", "finetune")


@dataclasses.dataclass
class DownstreamConfig:
  task: str
  elmo: str = "none"
  workdir: str | None = None
  bilm: str | None = None            # a training run's workdir, a folder, a released name or a URL
  bilm_init: str = "trained"         # "trained" or "random" (the untrained twin: same shape, random init)
  seed: int = 0
  num_epochs: int = 10
  patience: int = 3
  batch_size: int = 32
  learning_rate: float = 1e-3
  bilm_learning_rate: float = 1e-4
  grad_clip: float = 5.0
  min_count: int = 2
  dev_fraction: float = 0.1          # held out of train when no dev split is given
  max_train_sentences: int | None = None
  cache_dtype: str = "float16"
  layer_cache_dir: str | None = None  # frozen: keep the biLM layers on disk too, shared by seeds/settings
  embed_batch_size: int = 64
  model: dict[str, Any] = dataclasses.field(default_factory=dict)  # TaskConfig overrides


@dataclasses.dataclass
class Bilm:
  """A loaded biLM and what identifies it."""
  embedder: Any                      # elmo_jax.embedding.embedder.Embedder
  description: dict[str, Any]


def load_bilm(spec: str, init: str = "trained", seed: int = 0) -> Bilm:
  """`spec`: a training run's workdir (its `export/`, else its newest good checkpoint, read as
  `config.init_from` does), a folder with options.json + weights.hdf5, a released name (`small`, ...) or a
  URL. `init="random"`: the same shape, randomly initialised (seeded): the untrained twin."""
  model = resolve.resolve_model(spec, use="bilm")
  if model.checkpoints is not None:
    emb, description = _from_checkpoint(model.workdir)
  else:
    emb = Embedder.from_model(model, warm=False)  # a script: each shape compiles when first met
    options_file, weight_file = emb.model_files
    description = {"options_file": options_file, "weight_file": weight_file,
                   "weights_sha256": files.sha256_file(weight_file),
                   "options_sha256": files.sha256_file(options_file)}
  description = {"spec": spec, "init": init, **description, "options": emb.options}
  if init == "random":
    emb = emb.untrained_twin(seed=seed)
    description["random_seed"] = seed
  return Bilm(emb, description)


def _from_checkpoint(workdir: str) -> tuple[Any, dict[str, Any]]:
  """A run without an export yet (still training): its newest checkpoint that verifies."""
  config_file = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(config_file):
    raise FileNotFoundError(f"{config_file}: not found (is {workdir} a train.py workdir?)")
  with open(config_file, encoding="utf-8") as f:
    options = json.load(f)["options"]
  try:
    params, _, where = init_from.load(workdir, options, vocab_sha256="")
  except init_from.InitFromError as e:
    raise readers.InputError(str(e).replace("config.init_from=", "--bilm=")) from None
  digest = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(params):  # the weights' identity (a checkpoint is many files)
    digest.update(np.ascontiguousarray(leaf, np.float32).tobytes())
  emb = Embedder(options, params, warm=False)  # a script: each shape compiles when first met
  return emb, {"checkpoint": where.split(" (")[0], "weights_sha256": digest.hexdigest(),
               "weights_sha256_of": "float32 bytes of the biLM params, in tree order"}


def cache_layers(embedder: Any, split: data_lib.Encoded, dtype: str, batch_size: int, desc: str) -> np.ndarray:
  """Every token's biLM layers `[n_tokens, n_layers + 1, 2P]`, in sentence order (chunks keep the float32
  intermediates small)."""
  out = []
  bar = progress(desc=f"biLM {desc}", total=len(split), unit="sent")
  chunk = 2048
  for start in range(0, len(split), chunk):
    part = split.tokens[start:start + chunk]
    out.append(features.token_features(embedder, part, batch_size).astype(dtype))
    bar.update(len(part))
  bar.close()
  return np.concatenate(out)


def layer_cache_key(bilm: Bilm, split: data_lib.Encoded, dtype: str) -> str:
  """File name of a split's cached layers: the biLM's identity (weights hash, init, twin seed), the exact
  sentences (after any hold-out or subsampling) and the storage dtype."""
  digest = hashlib.sha256()
  description = bilm.description
  identity = [description.get("weights_sha256"), description.get("init"), description.get("random_seed"), dtype]
  digest.update(json.dumps(identity).encode())
  for sentence in split.tokens:
    digest.update(("\t".join(sentence) + "\n").encode())
  return f"bilm-layers-{digest.hexdigest()[:24]}"


def _tree_sum(tree: Any) -> jax.Array:
  return sum((jnp.sum(x) for x in jax.tree_util.tree_leaves(tree)), jnp.zeros((), jnp.float32))


def make_loss(model: TaskModel) -> Callable:
  """loss(params, batch, rng, deterministic) -> (cross entropy + sown mix L2, aux)."""
  task = model.config.task

  def loss_fn(params, batch, rng, deterministic=False):
    logits, state = model.apply(
        {"params": params}, batch["word_ids"], batch["char_ids"], batch["mask"], layers=batch.get("layers"),
        bilm_char_ids=batch.get("bilm_char_ids"), deterministic=deterministic, rngs={"dropout": rng},
        mutable=["losses"])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    weight = (batch["mask"] if task == "pos" else batch["rows"]).astype(jnp.float32)
    ce = jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1.0)
    l2 = _tree_sum(state.get("losses", {}))
    correct = jnp.sum((jnp.argmax(logits, -1) == batch["labels"]) * weight)
    return ce + l2, {"ce": ce, "l2": l2, "correct": correct, "count": jnp.sum(weight)}
  return loss_fn


def make_optimizer(cfg: DownstreamConfig) -> optax.GradientTransformation:
  """Adam with global-norm clipping; fine-tuning gives the biLM's params their own (lower) rate."""
  def adam(lr):
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), optax.adam(lr))
  if cfg.elmo != "finetune":
    return adam(cfg.learning_rate)
  # bilm_labels names the biLM's params "frozen"; here that group trains, at bilm_learning_rate.
  return optax.multi_transform({"trainable": adam(cfg.learning_rate), "frozen": adam(cfg.bilm_learning_rate)},
                               bilm_labels)


def evaluate(eval_step: Callable, params: Any, data: data_lib.Encoded, batch_iter: Callable) -> float:
  correct = count = 0.0
  for batch in batch_iter(data, None):
    aux = eval_step(params, {k: v for k, v in batch.items() if k not in ("index",)})
    correct += float(aux["correct"])
    count += float(aux["count"])
  return correct / max(count, 1.0)


def _encode_splits(cfg: DownstreamConfig, splits: dict[str, data_lib.Split], bilm: Bilm | None):
  """(train split used, labels, vocab, encoded splits, seconds spent caching biLM layers)."""
  task = cfg.task
  train_split = data_lib.subsample(splits["train"], cfg.max_train_sentences, cfg.seed)
  labels = data_lib.label_ids(task, splits["train"])
  for name in ("dev", "test"):
    data_lib.check_labels(task, splits[name], labels)
  vocab = data_lib.build_vocab(train_split.tokens, cfg.min_count)
  vocab_index, label_index = {w: i for i, w in enumerate(vocab)}, {l: i for i, l in enumerate(labels)}
  encoded = {name: data_lib.encode(task, train_split if name == "train" else splits[name], vocab_index,
                                   label_index) for name in ("train", "dev", "test")}
  t_cache = time.time()
  if cfg.elmo == "frozen":
    for name, enc in encoded.items():
      compute = functools.partial(cache_layers, bilm.embedder, enc, cfg.cache_dtype, cfg.embed_batch_size, name)
      enc.layers = features.cached(cfg.layer_cache_dir, layer_cache_key(bilm, enc, cfg.cache_dtype), compute)
  return train_split, labels, vocab, encoded, time.time() - t_cache


def _fit(cfg: DownstreamConfig, model: TaskModel, params, encoded, batch_iter, on_epoch):
  """Epochs of training with early stopping on dev accuracy: (best dev row, its params, the dev curve)."""
  tx = make_optimizer(cfg)
  opt_state = tx.init(params)
  loss_fn = make_loss(model)

  @jax.jit
  def train_step(params, opt_state, batch, rng):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, dict(aux, loss=loss)

  eval_step = jax.jit(lambda p, b: loss_fn(p, b, jax.random.key(0), deterministic=True)[1])
  rng = np.random.default_rng(cfg.seed)
  key = jax.random.key(cfg.seed)
  curve = []
  n_batches = -(-len(encoded["train"]) // cfg.batch_size)

  def run_epoch(epoch: int) -> tuple[dict[str, Any], Any]:
    nonlocal params, opt_state, key
    t0, losses = time.time(), []
    bar = progress(desc=f"epoch {epoch}/{cfg.num_epochs}", total=n_batches, unit="batch")
    for batch in batch_iter(encoded["train"], rng):
      batch.pop("index")
      key, step_key = jax.random.split(key)
      params, opt_state, aux = train_step(params, opt_state, batch, step_key)
      losses.append(aux["loss"])
      bar.update(1)
    bar.close()
    row = {"epoch": epoch, "train_loss": float(np.mean(jax.device_get(losses))),
           "dev_accuracy": evaluate(eval_step, params, encoded["dev"], batch_iter),
           "seconds": round(time.time() - t0, 2)}
    curve.append(row)
    if on_epoch is not None:
      on_epoch(row)
    return row, params

  # Ties keep the earlier epoch; the best params are copied to the host (they are tested and returned).
  best, _ = early_stopping.run_epochs(
      run_epoch, lambda record, best: best is None or record[0]["dev_accuracy"] > best[0]["dev_accuracy"],
      cfg.num_epochs, cfg.patience, keep=lambda record: (record[0], jax.device_get(record[1])))
  best, best_params = best if best is not None else (None, params)
  return best, best_params, curve, eval_step


def run(cfg: DownstreamConfig, splits: dict[str, data_lib.Split], bilm: Bilm | None = None,
        on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
  """Trains on splits["train"], early-stops on splits["dev"], scores splits["test"]; returns the results."""
  t_start = time.time()
  if cfg.elmo not in ELMO_SETTINGS:
    raise ValueError(f"elmo must be one of {ELMO_SETTINGS}, got {cfg.elmo!r}")
  if cfg.elmo != "none" and bilm is None:
    raise ValueError(f"elmo={cfg.elmo} needs a biLM")
  task = cfg.task
  train_split, labels, vocab, encoded, t_cache = _encode_splits(cfg, splits, bilm)
  bilm_config = bilm.embedder.config if bilm is not None else None
  task_cfg = TaskConfig(task=task, n_classes=len(labels), vocab_size=len(vocab), elmo=cfg.elmo,
                        n_bilm_layers=(bilm_config.n_layers + 1) if bilm_config else 3,
                        bilm=bilm_config if cfg.elmo == "finetune" else None, **cfg.model)
  model = TaskModel(task_cfg)
  char_len = 20  # the baseline's own char CNN: longer words are cut (the word embedding still sees them)
  bilm_chars = bilm_config.max_characters_per_token if cfg.elmo == "finetune" else None

  def batch_iter(data, rng):
    return data_lib.batches(data, cfg.batch_size, task=task, char_len=char_len, bilm_chars=bilm_chars, rng=rng)

  first = next(batch_iter(encoded["train"], None))
  first.pop("index")
  params = init_params(model, first, cfg.seed)
  if cfg.elmo == "finetune":
    params = dict(params, bilm=jax.tree_util.tree_map(jnp.asarray, bilm.embedder.params))
  t_train = time.time()
  best, best_params, curve, eval_step = _fit(cfg, model, params, encoded, batch_iter, on_epoch)
  t_train = time.time() - t_train
  test_accuracy = evaluate(eval_step, best_params, encoded["test"], batch_iter)
  return {
      "task": task, "elmo": cfg.elmo, "seed": cfg.seed,
      "test_accuracy": test_accuracy, "dev_accuracy": best["dev_accuracy"], "best_epoch": best["epoch"],
      "epochs_run": len(curve), "dev_curve": curve,
      "metric": "token accuracy" if task == "pos" else "sentence accuracy",
      "mixes": mix_summary(best_params),
      "settings": dict(dataclasses.asdict(cfg), model=dataclasses.asdict(
          dataclasses.replace(task_cfg, bilm=None))),
      "bilm": bilm.description if bilm is not None else None,
      "data": {name: {"source": s.source, "sha256": s.sha256, "sentences": len(enc),
                      "tokens": int(enc.offsets[-1])}
               for (name, enc), s in zip(encoded.items(), (train_split, splits["dev"], splits["test"]))},
      "n_labels": len(labels), "vocab_size": len(vocab),
      "majority_baseline": majority_baseline(encoded["train"], encoded["test"]),
      "n_params": int(sum(np.size(x) for x in jax.tree_util.tree_leaves(best_params))),
      "seconds": {"bilm_cache": round(t_cache, 2), "train": round(t_train, 2),
                  "total": round(time.time() - t_start, 2)},
      "_params": best_params,
  }


def majority_baseline(train: data_lib.Encoded, test: data_lib.Encoded) -> float:
  """Test accuracy of always predicting the most frequent training label (tag), over every test label."""
  flat = lambda d: np.concatenate([np.atleast_1d(y) for y in d.labels])  # noqa: E731
  return probes.majority_accuracy(flat(train), flat(test))


def mix_summary(params: Any) -> dict[str, Any]:
  """{scalar_mix_k: {"weights": softmax(w), "gamma": gamma}} of the task model's mixes."""
  return {name: {"weights": [float(x) for x in jax.nn.softmax(jnp.asarray(p["scalar_parameters"]))],
                 "gamma": float(p["gamma"])}
          for name, p in params.items() if name.startswith("scalar_mix_")}
