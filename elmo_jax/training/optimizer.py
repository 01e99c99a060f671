"""The optimizer of a run: bilm-tf's recipe (Adagrad after a global-norm clip) or Adam(W), an optional
linear warmup, and the frozen-biLM phase (`freeze.py`, `optax.multi_transform` over the biLM and softmax).
"""
from __future__ import annotations

import jax.numpy as jnp
import optax

from elmo_jax.training import freeze as freeze_lib


def make_optimizer(config) -> optax.GradientTransformation:
  """bilm-tf's recipe by default: Adagrad(lr 0.2, initial accumulator 1.0) after global-norm clip 10."""
  name = config.optimizer
  lr = make_schedule(config)
  if name == "adagrad":
    opt = optax.adagrad(lr, initial_accumulator_value=config.adagrad_initial_accumulator, eps=0.0)
  elif name == "adam":
    opt = optax.adam(lr)
  elif name == "adamw":
    opt = optax.adamw(lr, weight_decay=config.weight_decay)
  else:
    raise ValueError(f"config.optimizer must be 'adagrad', 'adam' or 'adamw', got {name!r}")
  freeze = int(config.freeze_bilm_steps or 0)
  if freeze < 0:
    raise ValueError(f"config.freeze_bilm_steps must be >= 0, got {freeze}")
  if freeze:  # another optimizer-state layout; resume refuses a changed value (resume._SHAPE_KEYS)
    return freeze_lib.bilm_frozen_for(freeze, optax.clip_by_global_norm(config.grad_clip), opt)
  return optax.chain(optax.clip_by_global_norm(config.grad_clip), opt)


def make_schedule(config) -> optax.ScalarOrSchedule:
  """The learning rate by optax's update count (0-based): config.learning_rate, after a linear warmup over
  config.warmup_steps. Update k (1-based) uses lr * min(k, warmup) / warmup: the first update is not wasted
  at rate 0. A plain float without warmup.

  Not `optax.linear_schedule(lr / warmup, lr, warmup - 1)`: equal in exact arithmetic, but its float32
  rates differ in the last bit for most (warmup, lr) pairs (58 of 75 tried), so runs and resumes of
  checkpoints written by this schedule would drift."""
  warmup = int(config.warmup_steps or 0)
  if not warmup:
    return config.learning_rate
  peak = float(config.learning_rate)
  return lambda count: peak * jnp.minimum(count + 1, warmup).astype(jnp.float32) / warmup


def learning_rate_at(config, step: int) -> float:
  """The learning rate the `step`-th update (1-based) applied, read off `make_schedule(config)`.

  A warmup rate is float32 (as the update applies it) and is given at float32's 7 significant digits, so
  the log says 0.03, not 0.029999997466802597."""
  schedule = make_schedule(config)
  return float(f"{float(schedule(step - 1)):.7g}") if callable(schedule) else float(schedule)
