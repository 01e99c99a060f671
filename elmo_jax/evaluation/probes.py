"""Linear probes on frozen features: softmax regression per layer or on a learned scalar mix.

The scalar mix follows ELMo (Peters et al. 2018, eq. 1): softmax-normalised layer
weights s and a scale gamma, trained jointly with the classifier. Each layer is
standardised first (mean/std from the training split) so that the mix weights
compare layers rather than their raw scales.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elmo_jax.evaluation import early_stopping
from elmo_jax.model.scalar_mix import ScalarMix


@dataclasses.dataclass
class ProbeConfig:
  learning_rate: float = 1e-2
  weight_decay: float = 1e-4
  batch_size: int = 4096
  max_epochs: int = 60
  patience: int = 5          # epochs without dev improvement before stopping
  dev_fraction: float = 0.1  # share of train carved off for early stopping
  seed: int = 0

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class ProbeResult:
  accuracy: float
  n: int                           # test examples scored
  mix_weights: list[float] | None  # softmax(s), only for a mixed probe
  gamma: float | None
  epochs: int                      # epochs run (incl. patience)
  best_epoch: int
  dev_accuracy: float


def dev_split(n_groups: int, fraction: float, seed: int) -> np.ndarray:
  """Boolean mask over groups (sentences or examples) marking the dev split."""
  rng = np.random.default_rng(seed)
  n_dev = int(round(n_groups * fraction))
  n_dev = min(max(n_dev, 1), n_groups - 1) if n_groups > 1 else 0
  mask = np.zeros(n_groups, bool)
  mask[rng.permutation(n_groups)[:n_dev]] = True
  return mask


# The mix logits are stored divided by this factor: with Adam that is a 10x
# learning rate for s alone, so the mix moves as fast as the classifier learns.
_S_SCALE = 10.0


def _mix_weights(params: dict) -> jnp.ndarray:
  return jax.nn.softmax(_S_SCALE * params["s"])


def _logits(params: dict, x: jnp.ndarray) -> jnp.ndarray:
  """x: (B, L, D) -> logits (B, C)."""
  mix = {"scalar_parameters": _S_SCALE * params["s"], "gamma": params["gamma"]}
  mixed = ScalarMix(x.shape[1]).apply({"params": mix}, jnp.moveaxis(x, 1, 0))
  return mixed @ params["w"] + params["b"]


@functools.partial(jax.jit, static_argnames=("tx",))
def _step(params, opt_state, x, y, mask, tx):
  """One optimiser step on a padded minibatch; mask zeroes the padding."""
  def loss_fn(p):
    ce = optax.softmax_cross_entropy_with_integer_labels(_logits(p, x), y)
    return jnp.sum(ce * mask) / jnp.maximum(jnp.sum(mask), 1.0)
  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


@jax.jit
def _predict(params, x, y):
  """Returns (number correct, summed cross-entropy) of a chunk."""
  logits = _logits(params, x)
  correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
  return correct, jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def _evaluate(params, x: np.ndarray, y: np.ndarray, chunk: int = 65536
              ) -> tuple[float, float]:
  """(accuracy, mean cross-entropy) over x: (N, L, D), y: (N,)."""
  if len(y) == 0:
    return float("nan"), float("nan")
  correct, loss = 0, 0.0
  for i in range(0, len(y), chunk):
    c, l = _predict(params, x[i:i + chunk], y[i:i + chunk])
    correct, loss = correct + int(c), loss + float(l)
  return correct / len(y), loss / len(y)


def majority_accuracy(y_train: np.ndarray, y_test: np.ndarray) -> float:
  """Test accuracy of always predicting the most frequent training label; y_train: int (N,), y_test: int
  (M,); 0.0 when M == 0."""
  return float(np.mean(y_test == np.bincount(y_train).argmax())) if len(y_test) else 0.0


def standardise(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
  """Per-layer, per-dimension z-scoring with train statistics. Arrays (N, L, D)."""
  mu = train.mean(axis=0, keepdims=True)
  sd = train.std(axis=0, keepdims=True) + 1e-6
  return [((a - mu) / sd).astype(np.float32) for a in (train,) + others]


def _train_with_early_stopping(params: dict, tx, x_fit: np.ndarray, y_fit: np.ndarray, x_dev: np.ndarray,
                               y_dev: np.ndarray, config: ProbeConfig) -> tuple[tuple, int]:
  """Epochs of minibatch steps until the dev loss stops improving; ((dev loss, dev accuracy, params,
  epoch) of the best epoch, epochs run)."""
  n = len(y_fit)
  opt_state = tx.init(params)

  # At least ~8 steps per epoch so small datasets still get enough updates
  # between early-stopping checks.
  batch = max(1, min(config.batch_size, max(64, -(-n // 8)), n))
  n_batches = -(-n // batch)
  x_fit_dev = jnp.asarray(x_fit)
  y_fit_dev = jnp.asarray(y_fit)
  rng = np.random.default_rng(config.seed)

  def run_epoch(epoch: int) -> tuple:
    nonlocal params, opt_state
    # Pad the permutation to whole batches so every step has one shape (one compile).
    order = rng.permutation(n)
    pad = n_batches * batch - n
    order = np.concatenate([order, np.zeros(pad, np.int64)])
    mask = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
    for i in range(n_batches):
      idx = order[i * batch:(i + 1) * batch]
      params, opt_state, _ = _step(params, opt_state, x_fit_dev[idx], y_fit_dev[idx],
                                   jnp.asarray(mask[i * batch:(i + 1) * batch]), tx)
    dev_acc, dev_loss = (_evaluate(params, x_dev, y_dev) if len(y_dev)
                         else _evaluate(params, x_fit, y_fit))
    return dev_loss, dev_acc, params, epoch

  # Early stopping on dev cross-entropy: accuracy plateaus (ties) long before
  # the mix has settled, while the loss keeps rewarding a better mix.
  # A patience below 1 still stops only at the first epoch without improvement.
  return early_stopping.run_epochs(
      run_epoch, lambda record, best: record[0] < best[0] - 1e-4, config.max_epochs,
      max(config.patience, 1), best=(float("inf"), float("nan"), params, 0))


def fit_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
              y_test: np.ndarray, n_classes: int, *, mix: bool,
              dev_mask: np.ndarray | None = None,
              config: ProbeConfig | None = None) -> ProbeResult:
  """Trains a softmax-regression probe with early stopping; scores test accuracy.

  Args:
    x_train: float (N, L, D) features; L == 1 for a single-layer probe.
    y_train: int (N,) labels in [0, n_classes).
    x_test: float (M, L, D).
    y_test: int (M,).
    n_classes: number of classes (2 gives logistic regression).
    mix: learn a scalar mix over the L layers (else L must be 1).
    dev_mask: bool (N,) rows held out for early stopping; by default a seeded
      `config.dev_fraction` of rows.
    config: hyperparameters.

  Returns:
    The test accuracy of the parameters with the best dev accuracy.
  """
  config = config or ProbeConfig()
  if not mix and x_train.shape[1] != 1:
    raise ValueError(f"a single-layer probe needs L == 1, got {x_train.shape}")
  if dev_mask is None:
    dev_mask = dev_split(len(y_train), config.dev_fraction, config.seed)
  x_fit, x_dev, x_test = standardise(x_train[~dev_mask], x_train[dev_mask], x_test)
  y_fit, y_dev = y_train[~dev_mask].astype(np.int32), y_train[dev_mask].astype(np.int32)
  y_test = y_test.astype(np.int32)
  _, n_layers, dim = x_fit.shape

  key = jax.random.PRNGKey(config.seed)
  params = {
      "s": jnp.zeros((n_layers,), jnp.float32),  # uniform mix at start
      "gamma": jnp.ones((), jnp.float32),
      "w": 0.01 * jax.random.normal(key, (dim, n_classes), jnp.float32),
      "b": jnp.zeros((n_classes,), jnp.float32),
  }
  # Only the classifier is weight-decayed: decaying s would pull the mix to uniform.
  decay_mask = {"s": False, "gamma": False, "w": True, "b": False}
  tx = optax.adamw(config.learning_rate, weight_decay=config.weight_decay,
                   mask=decay_mask)
  best, epoch = _train_with_early_stopping(params, tx, x_fit, y_fit, x_dev, y_dev, config)
  _, dev_acc, params, best_epoch = best
  weights = np.asarray(_mix_weights(params)).tolist() if mix else None
  return ProbeResult(
      accuracy=_evaluate(params, x_test, y_test)[0], n=int(len(y_test)),
      mix_weights=weights, gamma=float(params["gamma"]) if mix else None,
      epochs=epoch, best_epoch=best_epoch, dev_accuracy=float(dev_acc))


def probe_all_layers(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                     y_test: np.ndarray, n_classes: int, *,
                     dev_mask: np.ndarray | None = None,
                     config: ProbeConfig | None = None) -> dict[str, Any]:
  """One probe per layer plus one on a learned mix of all layers.

  Args:
    x_train: (N, L, D); x_test: (M, L, D); labels int.

  Returns:
    {"layer_0": acc, ..., "mix": acc, "mix_weights": [L floats], "gamma": g,
     "n": M, "dev": {...}}.
  """
  out: dict[str, Any] = {}
  dev = {}
  for layer in range(x_train.shape[1]):
    r = fit_probe(x_train[:, layer:layer + 1], y_train, x_test[:, layer:layer + 1],
                  y_test, n_classes, mix=False, dev_mask=dev_mask, config=config)
    out[f"layer_{layer}"] = r.accuracy
    dev[f"layer_{layer}"] = {"dev_accuracy": r.dev_accuracy, "best_epoch": r.best_epoch}
  r = fit_probe(x_train, y_train, x_test, y_test, n_classes, mix=True,
                dev_mask=dev_mask, config=config)
  out["mix"] = r.accuracy
  out["mix_weights"] = r.mix_weights
  out["gamma"] = r.gamma
  out["n"] = r.n
  dev["mix"] = {"dev_accuracy": r.dev_accuracy, "best_epoch": r.best_epoch}
  out["dev"] = dev
  return out
