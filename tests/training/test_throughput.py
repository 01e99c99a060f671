"""What a run reports about how well it runs (issue 32, item 2): per-device tokens/s, TFLOP/s from the planner's
analytic count, MFU against the chip's bf16 peak, HBM from memory_stats, and the roofline prediction line."""
from __future__ import annotations

import json
import os

import pytest

import tiny
from elmo_jax.formats import options as options_lib
from elmo_jax.measure import chips as chips_lib
from elmo_jax.measure import flops as flops_lib
from elmo_jax.training import throughput
from elmo_jax.training.config import with_global_batch

VOCAB = 50


class _Device:
  """What Throughput reads of a jax device."""

  def __init__(self, kind: str, stats: dict | None = None):
    self.device_kind, self.process_index, self._stats = kind, 0, stats

  def memory_stats(self):
    return self._stats


def _config(n_devices: int = 1, **overrides):
  return with_global_batch(tiny.train_config("unused.txt", **overrides), n_devices)


def _options(config):
  return options_lib.validate(config.options.to_dict(), "config.options")


def _hand_count(vocab: int) -> float:
  """The tiny trainer model's train FLOPs per token position, by hand: 3 x the forward pass of both directions
  (2 FLOPs per multiply-add), without token dedupe (one char-CNN row per position and direction)."""
  mc, cd, p, h, layers = 50, 4, 8, 32, 2  # chars per token, char embedding, projection, LSTM cell, layers
  conv = 2 * (mc - 1 + 1) * 1 * cd * 8 + 2 * (mc - 2 + 1) * 2 * cd * 8  # filters [[1, 8], [2, 8]]
  highway = 1 * 2 * (2 * 16 * 16)  # the small preset's one highway layer over 16 filters
  project = 2 * 16 * p  # 16 filters -> P = 8
  lstm = 2 * layers * (2 * (p + p) * 4 * h + 2 * h * p)  # both directions: gates from [x, h], then projection
  softmax = 2 * 2 * p * vocab  # both directions' targets over the full softmax
  return 3 * (2 * (conv + highway + project) + lstm + softmax)


def test_tflops_and_mfu_are_the_analytic_count_at_the_measured_rate():
  config = _config(2, dedupe_tokens=False, n_negative_samples=0)
  stats = [{"bytes_in_use": 2.5e9, "peak_bytes_in_use": 3.0e9}, {"bytes_in_use": 1.5e9, "peak_bytes_in_use": 4.0e9}]
  perf = throughput.Throughput(config, _options(config), VOCAB, devices=[_Device("TPU v5 lite", s) for s in stats])
  assert perf.flops_per_token == _hand_count(VOCAB) == 124_608
  # the same count the planner prints for this config at these rows per device
  assert perf.flops_per_token == flops_lib.train_flops_per_token(config, _options(config), VOCAB, 2)["train"]
  fields = perf.fields(2e6)  # tokens/s over both devices
  assert fields["tokens_per_sec_per_device"] == 1e6
  assert fields["tflops_per_sec_per_device"] == pytest.approx(1e6 * 124_608 / 1e12)
  assert fields["mfu"] == pytest.approx(1e6 * 124_608 / 197e12)  # TPU v5e's bf16 peak
  assert fields["hbm_in_use_gb"] == 2.5 and fields["hbm_peak_gb"] == 4.0  # the largest over the devices
  assert perf.unknown_chip_line() is None
  assert set(fields) == set(throughput.FIELDS)


def test_a_device_without_a_peak_or_memory_stats_has_no_mfu_and_no_hbm():
  config = _config()
  perf = throughput.Throughput(config, _options(config), VOCAB, devices=[_Device("cpu")])
  fields = perf.fields(1000.0)
  assert set(fields) == {"tokens_per_sec_per_device", "tflops_per_sec_per_device"}
  line = perf.unknown_chip_line()
  assert line.startswith("no roofline prediction and no mfu for 1 x cpu") and "\n" not in line
  assert perf.prediction_line(lambda: pytest.fail("compiled without a chip to predict for")) is None


@pytest.mark.parametrize("kind, chip", [("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"),
                                        ("TPU v6 lite", "v6e"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", None),
                                        ("NVIDIA A100-SXM4-80GB", None), ("cpu", None)])
def test_device_kinds_map_to_the_planner_chips(kind, chip):
  assert chips_lib.chip_of(kind) == chip


def _run(tmp_path, capsys, **overrides):
  from elmo_jax.training.loop import train_and_evaluate
  train = tmp_path / "train.txt"
  train.write_text("".join(f"the cat {i % 7} sat on mat {i % 5} .\n" for i in range(60)))
  config = tiny.train_config(str(train), **{"num_train_steps": 4, "log_every_steps": 2,
                                             "checkpoint_every_steps": 4, "n_negative_samples": 0,
                                             "data.vocab_max_size": VOCAB, **overrides})
  workdir = str(tmp_path / "run")
  train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if '"train_loss"' in line]
  with open(os.path.join(workdir, "vocab.txt")) as f:
    vocab = sum(1 for _ in f)  # the corpus's words, fewer than vocab_max_size
  return config, records, capsys.readouterr().out, vocab


@pytest.mark.slow
def test_a_cpu_run_logs_the_rates_and_says_once_why_there_is_no_mfu(tmp_path, capsys):
  config, records, out, vocab = _run(tmp_path, capsys)
  assert [r["step"] for r in records] == [2, 4]
  config = with_global_batch(config, 1)
  flops = flops_lib.train_flops_per_token(config, _options(config), vocab, config.batch_size)["train"]
  for r in records:
    assert "mfu" not in r and "hbm_in_use_gb" not in r  # no peak, no memory stats on the CPU
    assert r["tokens_per_sec_per_device"] == pytest.approx(r["tokens_per_sec"])  # one device
    assert r["tflops_per_sec_per_device"] == pytest.approx(r["tokens_per_sec"] * flops / 1e12)
  assert out.count("no roofline prediction and no mfu for 1 x cpu") == 1, out
  assert "TFLOP/s" in out and "/device" in out  # the progress line


@pytest.mark.slow
def test_on_a_chip_with_a_peak_the_run_states_the_prediction_and_logs_mfu(tmp_path, capsys, monkeypatch):
  """The accelerator path on the CPU: the planner's nominal cpu chip stands in for a known one."""
  monkeypatch.setattr(chips_lib, "chip_of", lambda kind: "cpu")
  _, records, out, _ = _run(tmp_path, capsys)
  lines = [line for line in out.splitlines() if line.startswith("roofline prediction for 1 x CPU")]
  assert len(lines) == 1 and "tokens/s per device" in lines[0] and "bound by" in lines[0], out
  assert out.index("training 4 steps") < out.index(lines[0]) < out.index("step 2/4")
  for r in records:
    assert r["mfu"] == pytest.approx(r["tflops_per_sec_per_device"] * 1e12 / chips_lib.CHIPS["cpu"].peak_flops)
  assert "MFU" in out


def test_a_log_window_that_timed_no_step_has_no_rate_not_zero():
  """metrics.jsonl said tokens_per_sec 0.0 for a window whose only step was the one waited for (after an eval
  or a save): the field is left out, and the log line says '-'."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from elmo_jax.training import metrics  # pylint: disable=g-import-not-at-top
  window = metrics.LogWindow()
  step = {"loss": np.float32(2.0), "loss_forward": np.float32(2.0), "loss_backward": np.float32(2.0),
          "grad_norm": np.float32(1.0), "n_tokens": np.float32(64)}
  window.add(1, step)  # waited for, not timed
  record = window.record(1)
  assert "tokens_per_sec" not in record and record["train_loss"] == 2.0
  assert " - tok/s" in metrics.progress_line(1, 10, record, 0.0, 0)
  window.add(2, step)
  window.add(3, step)  # timed
  assert window.record(3)["tokens_per_sec"] > 0
