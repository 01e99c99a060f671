"""The analytic FLOP count of the train step: matmul and conv FLOPs per token position (the planner's report, and
a run's `tflops_per_sec_per_device` and `mfu`)."""
from __future__ import annotations

from typing import Any
from elmo_jax.data import dedupe as dedupe_lib


def forward_flops_per_token(options: dict[str, Any], vocab: int, num_sampled: int,
                            cnn_rows_per_token: float = 2.0) -> dict[str, float]:
  """Matmul/conv FLOPs (2 per multiply-add) of one token position's forward pass, both directions.

  `cnn_rows_per_token`: char-CNN rows per token position: 2 when both windows are embedded position by
  position, less with token dedupe (distinct tokens per shard / positions).
  """
  cnn, lstm = options["char_cnn"], options["lstm"]
  mc, cd = cnn["max_characters_per_token"], cnn["embedding"]["dim"]
  nf = sum(n for _, n in cnn["filters"])
  p, h = lstm["projection_dim"], lstm["dim"]
  char = sum(2 * (mc - w + 1) * w * cd * n for w, n in cnn["filters"])
  char += cnn.get("n_highway", 0) * 2 * (2 * nf * nf) + (2 * nf * p if nf != p else 0)
  char *= cnn_rows_per_token
  rnn = 2 * lstm["n_layers"] * (2 * (p + p) * 4 * h + 2 * h * p)
  classes = (num_sampled + 1) if num_sampled and num_sampled < vocab else vocab
  soft = 2 * 2 * p * classes
  return {"char_cnn": float(char), "lstm": float(rnn), "softmax": float(soft), "total": float(char + rnn + soft)}


def train_flops_per_token(config, options: dict[str, Any], vocab: int, rows: int,
                          table_size: int = 0) -> dict[str, Any]:
  """The analytic count of the report (and of the trainer's `tflops_per_sec_per_device` and `mfu`): the train
  step's matmul/conv FLOPs per token position, 3 x the forward pass, at `rows` batch rows per device.

  {"train": FLOPs, "forward": `forward_flops_per_token`, "num_sampled": the trainer's rule for the softmax,
  "table_size": the deduped char-CNN rows per device (`table_size`, 0 = half the positions of one window,
  bucketed as the trainer does; it is taken even without config.dedupe_tokens, which counts 2 rows a token)}.
  """
  num_sampled = config.n_negative_samples if 0 < config.n_negative_samples < vocab - 1 else 0
  tokens = rows * int(config.unroll_steps)
  table = table_size or dedupe_lib.bucket_size(tokens // 2 + 1, cap=2 * tokens + 1)
  forward = forward_flops_per_token(options, vocab, num_sampled, table / tokens if config.dedupe_tokens else 2.0)
  return {"train": 3 * forward["total"], "forward": forward, "num_sampled": num_sampled, "table_size": table}
