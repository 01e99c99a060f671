"""`elmo-jax evaluate --model=X` takes every spec `elmo-jax embed --model=X` takes, through the one resolver
(`resolve.resolve_model` -> `loaded.load_model`): a released name, an options.json + weights.hdf5 folder, elmo_jax's
safetensors folder, a TF-Hub module, an ELMoForManyLangs folder, an archive, a file:// URL and a run's folder.
Perplexity needs the LM's softmax: a format without one is skipped with a one-line reason."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import efml_util
import evaluate
import fixture_models
from elmo_jax.evaluation import perplexity
from elmo_jax.sources import released
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, TFHUB_MODULE


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> dict[str, str]:
  """One spec of each kind `embed --model` takes, all of bilm-tf's fixture shape (the pair ones with a softmax)."""
  root = tmp_path_factory.mktemp("specs")
  pair = fixture_models.write_run_like(root / "pair")
  folder = fixture_models.write_safetensors_twin(pair, root / "safetensors")
  efml = str(root / "efml")
  os.makedirs(efml)
  efml_util.write_model(efml, zip_format=True)
  run = root / "run"
  shutil.copytree(pair, run / "export")
  shutil.copy(os.path.join(pair, "vocab.txt"), run / "vocab.txt")
  archive = shutil.make_archive(str(root / "pair_model"), "zip", str(root), "pair")
  small = released.MODELS["small"]
  mirror = root / "mirror" / small.key
  mirror.mkdir(parents=True)
  shutil.copy(FIXTURE_OPTIONS, mirror / f"elmo_{small.key}_options.json")
  shutil.copy(FIXTURE_WEIGHTS, mirror / f"elmo_{small.key}_weights.hdf5")
  return {"pair": pair, "safetensors": folder, "tfhub": TFHUB_MODULE, "efml": efml, "archive": archive,
          "file_url": "file://" + folder, "run": str(run), "released": "small",
          "mirror": "file://" + str(root / "mirror")}


# kind -> why perplexity cannot score it (None: it can)
KINDS = {"pair": None, "safetensors": None, "archive": None, "file_url": None, "run": None,
         "released": "has no softmax", "tfhub": "a TF-Hub elmo/3 module carries no LM softmax",
         "efml": "an ELMoForManyLangs release carries no LM softmax"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_evaluate_model_takes_every_spec_embed_takes(kind, specs, tmp_path, parsed_flags, monkeypatch):
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("ELMO_JAX_MODELS_URL", specs["mirror"])
  text = tmp_path / "text.txt"
  text.write_text("the bank\nbank the\n", encoding="utf-8")
  parsed_flags("--task=perplexity", f"--model={specs[kind]}", f"--text_file={text}", f"--output_dir={tmp_path}/out")
  task, cfg = evaluate.config_from_flags()
  assert task == "perplexity" and cfg.perplexity.model is not None
  if KINDS[kind] is None:
    perplexity.check(cfg.perplexity, cfg.workdir)
  else:
    with pytest.raises(perplexity.NoSoftmax, match=KINDS[kind]) as e:
      perplexity.check(cfg.perplexity, cfg.workdir)
    assert "\n" not in str(e.value)
  models = evaluate.load_models_from_flags(cfg.perplexity.model)  # the probes' Embedder, of the same model
  assert models.description["model"] == specs[kind] and models.trained.n_layers == 3
  assert models.key and models.key != models.untrained_key


def test_perplexity_of_a_safetensors_folder_equals_its_hdf5_pair(specs, tmp_path, parsed_flags):
  """The folder and the pair it was written from score the same text to the same perplexity."""
  text = tmp_path / "text.txt"
  text.write_text("the bank\nbank the the\n", encoding="utf-8")
  results = []
  for kind in ("pair", "safetensors"):
    out = tmp_path / kind
    parsed_flags("--task=perplexity", f"--model={specs[kind]}", f"--text_file={text}", f"--output_dir={out}",
                 "--batch_size=2", "--unroll_steps=4", "--noprogress")
    evaluate.main(["evaluate.py"])
    results.append(json.loads((out / "perplexity.json").read_text()))
  scores = [{k: v for k, v in r.items() if "perplexity" in k or "ppl" in k} for r in results]
  assert scores[0] and scores[0] == scores[1]
