"""What the device count changes (docs/embedding.md, Devices): the char CNN's rows (layer 0) not a bit, on any
weights; the biLSTM's layers only as much as a different batch size on one device does, since XLA:CPU's matmul
rounds a row by the call's row count and the recurrence carries that on. Checked on clip-heavy tiny weights
(the params x4, clips at 1: saturated gates amplify an ulp), where the two differences are far above 1e-6."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from launch_util import env
from paths import REPO_ROOT, TESTS_DIR

_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import jax, numpy as np
    import tiny
    from elmo_jax.model import make_model
    from elmo_jax.embedding.embedder import Embedder
    options = tiny.tiny_options(cell_clip=1.0, proj_clip=1.0)
    params = make_model(options).init(jax.random.PRNGKey(0), np.zeros((1, 1, 50), np.int32))["params"]
    params = jax.tree_util.tree_map(lambda x: np.asarray(x) * 4, params)
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(1, 20))) for _ in range(300)]
    sentences = [[words[i] for i in rng.integers(0, 300, rng.integers(1, 30))] for _ in range(40)]
    out = {}
    for devices in (1, 2, 8):
      out[f"d{devices}"] = Embedder(options, params, devices=devices).embed_sentences(sentences)
    out["d1_batch5"] = Embedder(options, params, devices=1).embed_sentences(sentences, 5)
    np.savez(sys.argv[2], **{f"{k}_{i}": x for k, v in out.items() for i, x in enumerate(v)})
""")


@pytest.mark.slow  # a subprocess on 8 simulated devices
def test_the_device_count_changes_no_char_cnn_row_and_the_lstm_as_a_batch_size_does(tmp_path):
  proc = subprocess.run([sys.executable, "-c", _RUN, TESTS_DIR, str(tmp_path / "out.npz")], cwd=REPO_ROOT,
                        capture_output=True, text=True, env=env(devices=8), timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with np.load(tmp_path / "out.npz") as f:
    got = {k: [f[f"{k}_{i}"] for i in range(40)] for k in ("d1", "d2", "d8", "d1_batch5")}
  diff = lambda a, b, layers=slice(None): max(float(np.abs(x[layers] - y[layers]).max())  # noqa: E731
                                              for x, y in zip(got[a], got[b]))
  for devices in ("d2", "d8"):
    assert diff("d1", devices, 0) == 0.0, devices  # the char CNN: bit for bit, whatever the device count
  batch = diff("d1", "d1_batch5")  # one device, another batch size: the biLSTM's rows round otherwise
  assert batch > 1e-6  # the weights amplify: what follows is not vacuous
  for devices in ("d2", "d8"):
    assert diff("d1", devices) <= 4 * batch, (devices, diff("d1", devices), batch)
