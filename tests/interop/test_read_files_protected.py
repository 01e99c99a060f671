"""What a command reads, it never writes: a resolved or loaded model knows every file it is read from
(`ResolvedModel.read_files`, `LoadedModel.input_files`: an EFML folder's architecture JSON, lexicons and
pickles, a TF-Hub module's data shard, a run's lexicon/), and every writer checks its outputs against that
set before writing anything: the embed command and `embed_file`, a run's workdir (train.py), `convert --to`,
evaluate.py's inputs, the downstream trainer's. Property-based over the models' files."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import efml_util
import tiny
from elmo_jax.downstream import data as downstream_data
from elmo_jax.embedding import writer
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.runtime import files
from elmo_jax.sources import convert
from elmo_jax.sources import loaded
from elmo_jax.sources import pretrained
from elmo_jax.training import preflight
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT, TFHUB_MODULE

KINDS = ("efml", "tfhub", "bilm")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """kind -> (folder, every file in it), copies the tests may try to overwrite."""
  pytest.importorskip("torch")
  root = tmp_path_factory.mktemp("models")
  efml_util.write_model(str(root / "efml"), zip_format=True)
  shutil.copytree(TFHUB_MODULE, root / "tfhub")
  (root / "bilm").mkdir()
  shutil.copy(FIXTURE_OPTIONS, root / "bilm" / "options.json")
  shutil.copy(FIXTURE_WEIGHTS, root / "bilm" / "weights.hdf5")
  (root / "bilm" / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n")
  return {k: (str(root / k), sorted(os.path.join(d, n) for d, _, ns in os.walk(root / k) for n in ns))
          for k in KINDS}


_EMBEDDERS: dict[str, Embedder] = {}


def _embedder(folder: str) -> Embedder:
  if folder not in _EMBEDDERS:
    _EMBEDDERS[folder] = Embedder.from_pretrained(folder, warm=False)
  return _EMBEDDERS[folder]


@pytest.mark.parametrize("kind", KINDS)
def test_every_file_of_the_folder_is_known_resolved_and_loaded(models, kind):
  folder, every = models[kind]
  found = pretrained.resolve_model(folder, fetch=False)
  assert set(found.read_files) == set(every)  # efml: tiny.json, the pickles; tfhub: index and data shard
  assert set(every) <= set(loaded.load_model(pretrained.resolve_model(folder)).input_files)
  assert set(every) <= set(map(os.path.abspath, _embedder(folder).input_files))
  assert set(every) <= set(downstream_data.bilm_files(folder))


@settings(max_examples=12, deadline=None)
@given(pick=st.tuples(st.sampled_from(KINDS), st.integers(0, 20)))
def test_embed_file_never_writes_over_a_file_of_its_model(models, tmp_path_factory, pick):
  folder, every = models[pick[0]]
  target = every[pick[1] % len(every)]
  before = files.sha256_file(target)
  text = tmp_path_factory.mktemp("in") / "in.txt"
  text.write_text("abc .\n")
  with pytest.raises(files.UnsafeOutputError) as e:
    writer.embed_file(_embedder(folder), text, target, progress_every=None)
  assert "is an input of this run" in str(e.value) and "\n" not in str(e.value)
  assert files.sha256_file(target) == before and not os.path.exists(target + ".partial")


@pytest.mark.parametrize("kind,name", [("efml", "tiny.json"), ("efml", "char.dic"),
                                       ("tfhub", "variables/variables.data-00000-of-00001")])
def test_the_embed_command_refuses_before_loading(models, tmp_path, kind, name):
  """The command's own check (before the model loads): the EFML folder's architecture JSON and lexicon, the
  module's data shard were replaced with exit 0."""
  folder = models[kind][0]
  target = os.path.join(folder, name)
  before = files.sha256_file(target)
  (tmp_path / "in.txt").write_text("abc .\n")
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--model={folder}",
                         f"--input_file={tmp_path / 'in.txt'}", f"--output_file={target}"], capture_output=True,
                        text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (f"error: --output_file={target} is an input of this run "
                                                  f"({target}); writing it would destroy it"), proc.stderr
  assert files.sha256_file(target) == before


@pytest.mark.parametrize("kind,owned", [("efml", "config.json"), ("bilm", "vocab.txt")])
def test_a_run_whose_workdir_is_its_init_from_source_is_refused_before_writing(models, tmp_path, kind, owned):
  """An EFML folder's config.json was replaced by the run's (EFML's package could no longer load it); a
  bilm-tf folder's vocab.txt before the run refused."""
  folder, every = models[kind]
  before = {p: files.sha256_file(p) for p in every}
  (tmp_path / "t.txt").write_text("the cat sat .\n" * 20)
  config = tiny.train_config(str(tmp_path / "t.txt"), init_from=folder)
  with pytest.raises(preflight.PreflightError) as e:
    preflight.check(config, folder)
  assert str(e.value) == (f"--workdir={folder} holds an input of this run ({os.path.join(folder, owned)}) where "
                          f"it writes its {owned}; writing it would destroy it: give another --workdir")
  assert {p: files.sha256_file(p) for p in every} == before
  preflight._check_sources_kept(config, str(tmp_path / "elsewhere"))  # pylint: disable=protected-access


@pytest.mark.parametrize("kind", KINDS)
def test_convert_to_a_folder_of_the_source_is_refused(models, tmp_path, kind):
  folder, every = models[kind]
  for to in sorted({os.path.dirname(p) for p in every}):
    with pytest.raises(files.UnsafeOutputError, match="holds an input of this run|is an input of this run|already holds"):
      convert.convert(folder, to, "efml" if kind == "efml" else "bilm-hdf5")
  assert all(os.path.exists(p) for p in every)


def test_a_runs_lexicon_and_config_are_files_of_the_run(tmp_path):
  """embed --workdir=RUN --output_file=RUN/lexicon/char.dic replaced an EFML-style run's lexicon."""
  run = tmp_path / "run"
  (run / "lexicon").mkdir(parents=True)
  (run / "export").mkdir()
  for rel in ("lexicon/char.dic", "lexicon/word.dic", "export/config.json", "config.json", "vocab.txt"):
    (run / rel).write_text("x\t0\n")
  found = pretrained.resolve_model(str(run), use="run", fetch=False)
  assert {os.path.relpath(p, run) for p in found.read_files} >= {
      "lexicon/char.dic", "lexicon/word.dic", "export/config.json", "config.json", "vocab.txt"}


@pytest.mark.parametrize("kind", ["efml", "bilm"])
def test_evaluate_knows_every_file_of_its_model(models, tmp_path, kind):
  """evaluate.py --model (resolved to an options/weights pair) and --workdir: every file of the model is one of
  the inputs its --output_dir and the files it writes there are checked against (`outputs.check_output_dir`)."""
  from elmo_jax.evaluation import outputs  # pylint: disable=g-import-not-at-top
  from elmo_jax.evaluation.config import EvalConfig  # pylint: disable=g-import-not-at-top
  folder, every = models[kind]
  options_file, weight_file = pretrained.resolve(folder)
  cfg = EvalConfig(output_dir=str(tmp_path / "out"))
  cfg.perplexity.options_file, cfg.perplexity.weight_file = options_file, weight_file
  assert set(every) <= {os.path.abspath(p) for p in outputs.input_files(cfg)}
  outputs.check_output_dir(cfg, ["perplexity"])  # a new folder elsewhere: fine
  run = tmp_path / "run"
  (run / "lexicon").mkdir(parents=True)
  (run / "lexicon" / "char.dic").write_text("a\t0\n")
  cfg = EvalConfig(output_dir=str(tmp_path / "out"), workdir=str(run))
  assert str(run / "lexicon" / "char.dic") in outputs.input_files(cfg)
