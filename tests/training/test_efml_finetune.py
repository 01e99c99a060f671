"""Continue training released ELMo in other formats (configs/finetune.py): an ELMoForManyLangs folder written by
EFML's own code (legacy format) and a TF-Hub module as `init_from`; the frozen phase keeps the biLM and the
word embedding bit for bit; the run exports an EFML folder that EFML's Embedder loads; resume after kill -9 is
bit-exact and 8 devices equal 1; one-line refusals before anything is written; configs/efml.py trains a new
language from scratch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import efml_util
import launch_util as lu
from elmo_jax.formats import efml
from elmo_jax.formats import tfhub
from elmo_jax.training import init_from, variant
from paths import REPO_ROOT, TFHUB_MODULE

TR = os.path.join(REPO_ROOT, "data", "tr-twt-tiny")
FINETUNE = os.path.join(REPO_ROOT, "configs", "finetune.py")
FREEZE, STEPS = 2, 4


def _needs_efml():
  pytest.importorskip("torch", reason="pip install -r requirements-test.txt")
  pytest.importorskip("elmoformanylangs", reason="pip install -r requirements-test.txt")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  _needs_efml()
  folder = str(tmp_path_factory.mktemp("efml_src") / "tiny.model")
  efml_util.write_model(folder, zip_format=False, seed=1)
  with open(os.path.join(folder, "encoder.pkl"), "rb") as f:
    assert not f.read(2) == b"PK"  # EFML's legacy (PyTorch <= 1.5) layout, as its releases
  return folder


def _finetune_config(init: str, **overrides):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("finetune_config", FINETUNE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.init_from = init
  c.data.train_files = os.path.join(TR, "train.txt.gz")
  c.data.eval_files = os.path.join(TR, "valid.txt.gz")
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


# --- refusals: one line naming the field, before anything is written ----------------------------------------
def test_config_shape_differing_from_the_source_is_refused(source, tmp_path):
  c = _finetune_config(source, **{"options.lstm.dim": 32})
  with pytest.raises(init_from.InitFromError) as e:
    variant.resolve(c, str(tmp_path / "run"))
  assert str(e.value).startswith(f"config.options.lstm.dim=32 asks for another shape than config.init_from={source}"
                                 " (16)") and "\n" not in str(e.value)
  resolved = variant.resolve(_finetune_config(source, **{"options.lstm.dim": 16}), str(tmp_path / "run"))
  assert resolved.options.lstm.dim == 16 and resolved.options.char_cnn.highway == "allennlp"
  assert resolved.data.lexicon == source and resolved.export_format == "efml"
  assert not (tmp_path / "run").exists()


def test_efml_folder_whose_word_dic_and_weights_disagree_is_refused(source, tmp_path):
  folder = str(tmp_path / "model")
  shutil.copytree(source, folder)
  with open(os.path.join(folder, "word.dic"), "a", encoding="utf-8") as f:
    f.write(f"extra\t{len(efml_util.WORDS)}\n")
  with pytest.raises(init_from.InitFromError) as e:
    variant.resolve(_finetune_config(folder), str(tmp_path / "run"))
  message = str(e.value)
  assert message.startswith(f"config.init_from={folder}: {folder}/word.dic: 9 entries") and "\n" not in message
  assert "has 8 rows" in message and not (tmp_path / "run").exists()


def test_export_format_that_cannot_hold_the_model_is_refused(source, tmp_path):
  with pytest.raises(init_from.InitFromError) as e:
    variant.resolve(_finetune_config(source, export_format="bilm-hdf5"), str(tmp_path / "run"))
  assert str(e.value).startswith("config.export_format=bilm-hdf5: an ELMoForManyLangs model cannot be held "
                                 "in bilm-tf's layout") and "\n" not in str(e.value)
  with pytest.raises(init_from.InitFromError, match=r"^config.export_format=efml: a bilm-tf-shaped model"):
    variant.resolve(_finetune_config(TFHUB_MODULE, export_format="efml"), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_efml_folder_in_an_archive_is_a_source(source, tmp_path, monkeypatch):
  """An EFML release as its zip (how EFML publishes them): unpacked once into the cache, its options and its
  lexicons become the run's."""
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  archive = shutil.make_archive(str(tmp_path / "tiny.model"), "zip", os.path.dirname(source),
                                os.path.basename(source))
  folder = init_from.released_source(archive).efml_dir
  assert folder is not None and folder.startswith(str(tmp_path / "cache"))
  resolved = variant.resolve(_finetune_config(archive), str(tmp_path / "run"))
  assert resolved.data.lexicon == folder and resolved.options.char_cnn.char_vocab_size == len(efml_util.CHARS)
  assert resolved.options.char_cnn.word_embedding.n_words == len(efml_util.WORDS)


@pytest.mark.slow
def test_train_py_refuses_in_one_line_and_writes_nothing(source, tmp_path):
  proc = subprocess.run([sys.executable, "train.py", f"--workdir={tmp_path / 'run'}", f"--config={FINETUNE}",
                         f"--config.init_from={source}", f"--config.data.train_files={TR}/train.txt.gz",
                         "--config.options.lstm.projection_dim=64"], cwd=REPO_ROOT, env=lu.env(1),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("train: error: config.options.lstm.projection_dim=64 asks "
                                                        "for another shape")
  assert not (tmp_path / "run").exists()


# --- end to end: train.py on 8 devices and 1, killed and resumed --------------------------------------------


@pytest.fixture(scope="module")
def runs(source, tmp_path_factory):
  """F: EFML source fine-tuned on Turkish on 8 devices (biLM frozen for 2 of 4 steps, a checkpoint each step);
  O: the same on 1 device; K: F's command killed (-9) after step 3, then rerun; H: a TF-Hub module, 1 step."""
  root = str(tmp_path_factory.mktemp("efml_ft"))
  flags = (f"--config.init_from={source}", f"--config.data.train_files={TR}/train.txt.gz",
           f"--config.data.eval_files={TR}/valid.txt.gz", "--config.batch_size=8", "--config.unroll_steps=5",
           f"--config.num_train_steps={STEPS}", f"--config.freeze_bilm_steps={FREEZE}",
           "--config.checkpoint_every_steps=1", "--config.log_every_steps=1", f"--config.eval_every_steps={STEPS}",
           "--config.keep_checkpoints=10", "--config.n_negative_samples=0")
  w = {n: os.path.join(root, n) for n in "fokh"}
  logs = {n: os.path.join(root, n + ".log") for n in "fokh"}
  hub = (f"--config.init_from={TFHUB_MODULE}", f"--config.data.train_files={TR}/train.txt.gz",
         "--config.batch_size=4", "--config.unroll_steps=5", "--config.num_train_steps=1",
         "--config.freeze_bilm_steps=1", "--config.n_negative_samples=0", "--config.data.eval_files=")
  procs = [lu.launch(w["f"], FINETUNE, *flags, log=logs["f"], devices=8),
           lu.launch(w["k"], FINETUNE, *flags, log=logs["k"], devices=8, signal_at="3:KILL")]
  assert lu.wait(procs, timeout=900)[0] == 0, lu.read(logs["f"])[-3000:]
  procs = [lu.launch(w["k"], FINETUNE, *flags, log=logs["k"], devices=8),
           lu.launch(w["o"], FINETUNE, *flags, log=logs["o"], devices=1),
           lu.launch(w["h"], FINETUNE, *hub, log=logs["h"], devices=1)]
  codes = lu.wait(procs, timeout=900)
  assert codes == [0, 0, 0], codes + [lu.read(logs[n])[-2000:] for n in "koh"]
  wanted = [(w["f"], k) for k in range(1, STEPS + 1)] + [(w["h"], 1)]
  specs = [f"{d},{k},{d}-{k}.npz" for d, k in wanted]
  done = subprocess.run([sys.executable, "-c", lu.DUMP_CHECKPOINT_PARAMS, *specs], env=lu.env(devices=8),
                        capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  params = {(d, k): dict(np.load(f"{d}-{k}.npz")) for d, k in wanted}
  return {**w, "params": params, **{n + "_log": lu.read(p) for n, p in logs.items()}}


def _bilm(flat: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k: v for k, v in flat.items() if k.startswith("['bilm']")}


@pytest.mark.slow
def test_frozen_phase_keeps_the_efml_bilm_and_word_embedding_bit_for_bit(runs, source):
  _, params, _ = efml.load(source)
  want = lu.flat_params({"bilm": params})
  assert "['bilm']['char_cnn']['word_embed']" in want
  for k in range(1, FREEZE + 1):
    got = _bilm(runs["params"][(runs["f"], k)])
    assert sorted(got) == sorted(want)
    for name in want:
      assert got[name].tobytes() == want[name].tobytes(), (k, name)
  after = _bilm(runs["params"][(runs["f"], FREEZE + 1)])
  assert not np.array_equal(after["['bilm']['char_cnn']['word_embed']"], want["['bilm']['char_cnn']['word_embed']"])
  log = runs["f_log"]
  assert "no softmax in the release: a new one" in log and f"ELMoForManyLangs folder {source}" in log
  assert "have no word.dic entry (<oov>)" in log and "biLM frozen for steps 1-2" in log


@pytest.mark.slow
def test_export_is_an_efml_folder_that_efml_loads_with_our_layers(runs):
  from elmoformanylangs import Embedder as EFMLEmbedder  # pylint: disable=g-import-not-at-top
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  export = os.path.join(runs["f"], "export")
  assert sorted(os.listdir(export)) == ["char.dic", "cnn_5_6_8_16_sample.json", "config.json", "encoder.pkl",
                                        "token_embedder.pkl", "word.dic"]
  sentences = [["Bu", "bir", "deneme", "."], ["abc", "中文", "zzz"]]
  want = EFMLEmbedder(export).sents2elmo(sentences, output_layer=-2)
  got = Embedder.from_pretrained(runs["f"]).embed_sentences(sentences)  # the run, as --model=WORKDIR
  for g, t in zip(got, want):
    assert g.shape == t.shape == (3, g.shape[1], 16)
    np.testing.assert_allclose(g, t, atol=1e-5, rtol=0)
  _, exported, _ = efml.load(export)  # the export holds the last step's biLM, bit for bit
  last = _bilm(runs["params"][(runs["f"], STEPS)])
  for name, value in lu.flat_params({"bilm": exported}).items():
    assert value.tobytes() == last[name].tobytes(), name


@pytest.mark.slow
def test_resume_after_kill_is_bit_exact_and_8_devices_equal_1(runs):
  assert "resumed from step 3" in runs["k_log"]
  assert lu.records(runs["f"]) == lu.records(runs["k"])
  for name in ("token_embedder.pkl", "encoder.pkl", "char.dic", "word.dic"):
    a, b = (open(os.path.join(runs[n], "export", name), "rb").read() for n in "fk")
    assert a == b, name
  one, eight = lu.records(runs["o"]), lu.records(runs["f"])
  assert [r["step"] for r in one] == [r["step"] for r in eight]
  for a, b in zip(one, eight):
    for key in ("train_loss", "eval_ppl", "unigram_ppl"):
      if key in a:
        assert abs(a[key] - b[key]) <= 1e-5 * max(1.0, abs(a[key])), (key, a, b)
  _, p1, _ = efml.load(os.path.join(runs["o"], "export"))
  _, p8, _ = efml.load(os.path.join(runs["f"], "export"))
  assert max(float(np.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(p1),
                                                         jax.tree_util.tree_leaves(p8))) <= 1e-5


@pytest.mark.slow
def test_tfhub_module_first_step_bilm_is_the_module_bit_for_bit(runs):
  want = lu.flat_params({"bilm": tfhub.load(TFHUB_MODULE, quiet=True).params})
  got = _bilm(runs["params"][(runs["h"], 1)])
  assert sorted(got) == sorted(want)
  for name in want:
    assert got[name].tobytes() == np.asarray(want[name], np.float32).tobytes(), name
  assert f"TF-Hub module {TFHUB_MODULE}" in runs["h_log"]
  assert os.path.isfile(os.path.join(runs["h"], "export", "weights.hdf5"))  # bilm-tf's layout, its format
  assert json.load(open(os.path.join(runs["h"], "config.json")))["export_format"] == "bilm-hdf5"


# --- a new language from scratch ---------------------------------------------------------------------------
@pytest.mark.slow
def test_new_language_config_beats_unigram_and_exports_for_efml(tmp_path):
  _needs_efml()
  from elmoformanylangs import Embedder as EFMLEmbedder  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  from elmo_jax.training.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("efml_config", os.path.join(REPO_ROOT, "configs", "efml.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.data.train_files, c.data.eval_files = f"{TR}/train.txt.gz", f"{TR}/valid.txt.gz"
  c.options.lstm.dim, c.options.lstm.projection_dim = 32, 8
  c.options.char_cnn.filters, c.options.char_cnn.embedding.dim = [[1, 8], [2, 8]], 4
  c.options.char_cnn.word_embedding.dim = 8
  c.options.char_cnn.max_characters_per_token = 20
  c.num_train_steps = c.eval_every_steps = c.checkpoint_every_steps = 300
  c.batch_size, c.learning_rate, c.log_every_steps = 16, 1e-2, 100
  train_and_evaluate(c, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  (base,) = [r for r in rows if "unigram_ppl" in r]
  last = [r for r in rows if "eval_ppl" in r][-1]
  assert last["step"] == 300 and last["eval_ppl"] < 0.9 * base["unigram_ppl"], (last, base)
  lex = variant.lexicon(c, str(tmp_path))
  assert list(lex.word2id)[:4] == ["<oov>", "<bos>", "<eos>", "<pad>"]
  assert list(lex.char2id)[-6:] == ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"] and "ş" in lex.char2id
  export = str(tmp_path / "export")
  sentences = [["Bugün", "hava", "çok", "güzel", "."]]
  want = EFMLEmbedder(export).sents2elmo(sentences, output_layer=-2)
  from elmo_jax.embedding.embedder import Embedder  # pylint: disable=g-import-not-at-top
  got = Embedder.from_pretrained(export).embed_sentences(sentences)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=0)
