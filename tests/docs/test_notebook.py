"""Executes notebooks/inspect_elmo.ipynb end to end against a tiny trained run."""
from __future__ import annotations

import json
import os
import sys

import pytest
from paths import REPO_ROOT

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
kernelspec = pytest.importorskip("ipykernel.kernelspec")

from tiny import train_tiny  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.slow  # subprocess runs of train.py / a notebook kernel

NOTEBOOK = os.path.join(REPO_ROOT, "notebooks", "inspect_elmo.ipynb")
KERNEL = "elmo-jax-test"


def test_notebook_runs_and_draws(tmp_path, monkeypatch):
  workdir = train_tiny(str(tmp_path / "run"))
  # A probe result in eval/ exercises the mix-weights plot.
  os.makedirs(os.path.join(workdir, "eval"))
  with open(os.path.join(workdir, "eval", "pos.json"), "w") as f:
    json.dump({"trained": {"mix_weights": [0.2, 0.5, 0.3]}}, f)
  # A kernel spec that runs *this* interpreter: the default "python3" spec says plain `python`,
  # which on PATH may be another Python without jax/elmo_jax.
  prefix = str(tmp_path / "jupyter")
  kernelspec.install(kernel_name=KERNEL, prefix=prefix)
  spec_file = os.path.join(prefix, "share", "jupyter", "kernels", KERNEL, "kernel.json")
  with open(spec_file) as f:
    assert json.load(f)["argv"][0] == sys.executable
  monkeypatch.setenv("JUPYTER_PATH", os.path.join(prefix, "share", "jupyter"))
  monkeypatch.setenv("ELMO_WORKDIR", workdir)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("ELMO_OPTIONS", raising=False)

  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300,
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()  # raises CellExecutionError on the first failing cell

  outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  # bank + plant heatmaps, mix weights, perplexity curve.
  assert len(images) >= 4, [o.get("output_type") for o in outputs]
  text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
  assert "query:" in text and "layer 2" in text
