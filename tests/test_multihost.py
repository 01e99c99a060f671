"""Two processes x 2 CPU devices (gloo collectives over 127.0.0.1) against one process x 4 devices.

Both use `data.shard="rows"`, so the global batch of every step is the same whatever the process count,
and the losses must agree (up to the order of the cross-process all-reduce). The 2-process run is killed
with SIGKILL after a checkpoint and resumed, so this also checks a multi-process exact resume.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import launch_util as lu

STEPS, EVERY = 12, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("mh"))
  cache = os.path.join(root, "jax_cache")
  train = lu.write_corpus(os.path.join(root, "train.txt"))
  config = lu.write_config(os.path.join(root, "tiny.py"), train, num_train_steps=STEPS,
                           checkpoint_every_steps=EVERY, log_every_steps=1)
  single, multi = os.path.join(root, "single"), os.path.join(root, "multi")
  flags = ("--config.data.shard=rows",)
  one = lu.launch(single, config, *flags, log=os.path.join(root, "single.log"), devices=4, cache_dir=cache)

  def two(sleep):
    port = lu.free_port()
    return [lu.launch(multi, config, *flags, f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                      f"--process_id={i}", log=os.path.join(root, f"multi{i}.log"), devices=2, sleep=sleep,
                      cache_dir=cache) for i in range(2)]

  procs = two(sleep=0.2)
  lu.wait_for(lambda: os.path.exists(f"{multi}/checkpoints/checksums/4.json") and lu.max_step(multi) >= 5,
              procs, timeout=150, what="checkpoint 4 of the 2-process run")
  for p in procs:  # a preempted slice: every host dies at once
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.wait()
  killed_at = lu.max_step(multi)
  procs = two(sleep=0.0)
  codes = lu.wait([one, *procs], timeout=170)
  logs = {name: lu.read(os.path.join(root, f"{name}.log")) for name in ("single", "multi0", "multi1")}
  assert codes == [0, 0, 0], "\n".join(text[-2500:] for text in logs.values())
  return {"single": single, "multi": multi, "logs": logs, "killed_at": killed_at}


def test_two_processes_match_one_and_resume(runs):
  assert "2 process(es)" in runs["logs"]["multi0"] and "4 device(s)" in runs["logs"]["multi0"]
  assert "resumed from step" in runs["logs"]["multi0"] and "resumed from step" in runs["logs"]["multi1"]
  one, two = lu.records(runs["single"]), lu.records(runs["multi"])
  assert [r["step"] for r in two] == list(range(1, STEPS + 1))  # rewound: every step once
  for a, b in zip(one, two):
    for key in ("train_loss", "train_ppl_forward", "train_ppl_backward", "grad_norm"):
      assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])
  a, b = lu.exported(runs["single"]), lu.exported(runs["multi"])
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_only_process_zero_writes_metrics(runs):
  # Process 1 never opens metrics.jsonl or exports; both logs report the same final step.
  assert "done: step 12" in runs["logs"]["multi0"] and "done: step 12" in runs["logs"]["multi1"]
  assert not os.path.exists(os.path.join(runs["multi"], "export.tmp"))
