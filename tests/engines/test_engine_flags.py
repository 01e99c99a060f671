"""`elmo-jax embed`'s engine flags: each misuse one usage line before any work (no Ray needed), and
`--mix_weights` on the local engine: the weighted sum of the layers, equal to the layers' own weighted sum."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
from absl import app

from conftest import command_flags
from elmo_jax.cli import embed
from paths import FIXTURE_DIR


@pytest.fixture
def embed_flags():
  yield from command_flags(embed.define_flags, "embed")


@pytest.mark.parametrize("args,message", [
    (["--input_file=x"], "--engine=ray writes shards: give --output_dir"),
    (["--output_dir=o"], "--input_file is required"),
    (["--input_file=x", "--output_dir=o", "--output_file=o.hdf5"], "--output_file is not for --engine=ray"),
    (["--input_file=x", "--output_dir=o", "--stateful"], "--stateful is not for --engine=ray"),
    (["--input_file=x", "--output_dir=o", "--options_file=a", "--weight_file=b"],
     "--options_file is not for --engine=ray (give the folder of options.json + weights as --model)"),
    (["--input_file=x", "--output_dir=o", "--top", "--mix_weights=1,0,0"], "give at most one of"),
    (["--input_file=x", "--output_dir=o", "--mix_weights=1,a,0"], "--mix_weights: could not convert"),
])
def test_ray_engine_usage_errors(embed_flags, args, message):
  model = [] if any(a.startswith("--options_file") for a in args) else [f"--model={FIXTURE_DIR}"]
  embed_flags("--engine=ray", *model, *args)
  with pytest.raises(app.UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
    embed.main(["embed"])


def test_ray_flags_are_refused_on_the_local_engine(embed_flags, tmp_path):
  embed_flags(f"--model={FIXTURE_DIR}", "--input_file=x", f"--output_file={tmp_path}/o.hdf5", "--output_dir=o")
  with pytest.raises(app.UsageError, match="--output_dir is for --engine=ray"):
    embed.main(["embed"])


def test_mix_weights_on_the_local_engine(embed_flags, tmp_path):
  text = tmp_path / "t.txt"
  text.write_text("the cat sat\non the mat\n")
  embed_flags(f"--model={FIXTURE_DIR}", f"--input_file={text}", f"--output_file={tmp_path}/all.hdf5", "--all",
              "--noprogress")
  assert embed.main(["embed"]) == 0
  embed_flags(f"--model={FIXTURE_DIR}", f"--input_file={text}", f"--output_file={tmp_path}/mix.hdf5",
              "--mix_weights=0.5,0.25,0.25", "--noprogress")
  assert embed.main(["embed"]) == 0
  with h5py.File(tmp_path / "all.hdf5") as layers, h5py.File(tmp_path / "mix.hdf5") as mix:
    for key in ("0", "1"):
      want = np.tensordot(np.float32([0.5, 0.25, 0.25]), layers[key][()], axes=(0, 0))
      np.testing.assert_allclose(mix[key][()], want, atol=1e-6)
  embed_flags(f"--model={FIXTURE_DIR}", f"--input_file={text}", f"--output_file={tmp_path}/bad.hdf5",
              "--mix_weights=1,1", "--noprogress")
  assert embed.main(["embed"]) == 1  # "2 mix weights for a model of 3 layers", one line
