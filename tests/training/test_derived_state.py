"""A workdir with no checkpoint holds no trained state (training/derived.py): everything a start derives —
vocab.txt, an EFML-style run's lexicon/{char,word}.dic, config.json's options — is derived again by the next
start (from its own text, settings and source) and replaces a dead start's; where a checkpoint holds the run
it is read back as the run trained with it. Property-based over the two texts and the word lexicon."""
from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

import tiny
from elmo_jax.data import Vocab
from elmo_jax.data import lexicon as lexicon_lib
from elmo_jax.training import derived, variant
from elmo_jax.training import input as input_lib
from elmo_jax.training.workdir import Workdir
from paths import REPO_ROOT, TFHUB_MODULE


def _config(module: str):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(f"_cfg_{module}", os.path.join(REPO_ROOT, "configs", f"{module}.py"))
  loaded = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(loaded)
  return loaded.get_config()


def _efml_config(train: str, words: bool):
  c = _config("efml")
  c.data.train_files, c.data.eval_files, c.data.pretokenized, c.data.vocab_min_count = train, "", True, 1
  c.options.char_cnn.word_embedding.dim = 8 if words else 0
  return c


def _fake_checkpoint(workdir: str, config) -> None:
  """The meta item of an Orbax step folder, as the trainer writes it: a checkpoint holds the run."""
  meta = os.path.join(workdir, "checkpoints", "40", "meta")
  os.makedirs(meta)
  with open(os.path.join(meta, "metadata"), "w") as f:
    json.dump({"config": config.to_dict(), "data": [{}]}, f)


def _start(config, workdir: str):
  """What a start derives before its first step (loop.open_run's order), without a device step."""
  c = variant.resolve(config, workdir)
  run = Workdir(workdir)
  lex = variant.lexicon(c, workdir, checkpoints=run.checkpoints)
  variant.save_lexicon(lex, workdir, run.checkpoints)
  tokens = [line.split() for line in open(c.data.train_files, encoding="utf-8")]
  vocab = input_lib._run_vocab(c, run, lambda: Vocab.build(tokens))  # pylint: disable=protected-access
  if not os.path.exists(os.path.join(workdir, "config.json")):
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(c.to_dict(), f)
  return c, lex, vocab


_WORD = st.text(alphabet=st.sampled_from("abcdeşğüxyz中文"), min_size=1, max_size=6)
_TEXT = st.lists(st.lists(_WORD, min_size=1, max_size=6), min_size=2, max_size=8)


@settings(max_examples=20, deadline=None)
@given(a=_TEXT, b=_TEXT, words_b=st.booleans(), checkpointed=st.booleans())
def test_a_dead_starts_vocab_and_lexicons_are_derived_again(a, b, words_b, checkpointed):
  with tempfile.TemporaryDirectory() as tmp:
    paths = []
    for name, text in (("a.txt", a), ("b.txt", b)):
      paths.append(os.path.join(tmp, name))
      with open(paths[-1], "w", encoding="utf-8") as f:
        f.writelines(" ".join(s) + "\n" for s in text)
    workdir = os.path.join(tmp, "run")
    os.makedirs(workdir)
    c_a, lex_a, vocab_a = _start(_efml_config(paths[0], True), workdir)  # the start that dies
    if checkpointed:
      _fake_checkpoint(workdir, c_a)
    c_b, lex, vocab = _start(_efml_config(paths[1], words_b), workdir)
    lexicon_dir = os.path.join(workdir, variant.LEXICON_DIR)
    if checkpointed:  # a resume: what the checkpoint trained with, untouched
      assert lex.char2id == lex_a.char2id and vocab.sha256() == vocab_a.sha256()
      assert c_b.options.char_cnn.char_vocab_size == len(lex_a.char2id)
      return
    want = lexicon_lib.build(b, 50, 1, 20_000, words_b)
    assert lex.char2id == want.char2id and lex.word2id == want.word2id
    assert c_b.options.char_cnn.char_vocab_size == len(want.char2id)
    assert c_b.options.char_cnn.word_embedding.n_words == len(want.word2id or ())
    saved = lexicon_lib.read(lexicon_dir, 50, words_b)
    assert saved.char2id == want.char2id and saved.word2id == want.word2id
    assert os.path.exists(os.path.join(lexicon_dir, lexicon_lib.WORD_DIC)) == words_b  # no stale word.dic
    assert vocab.sha256() == Vocab.build(b).sha256() == Vocab.load(workdir).sha256()


def test_replaced_lexicons_are_said_in_one_line(tmp_path, capsys):
  for name, text in (("a.txt", "bir iki üç\n"), ("b.txt", "one two three\n")):
    (tmp_path / name).write_text(text * 3)
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  _start(_efml_config(str(tmp_path / "a.txt"), True), workdir)
  capsys.readouterr()
  _start(_efml_config(str(tmp_path / "b.txt"), True), workdir)
  out = capsys.readouterr().out  # log.info's channel
  assert "the earlier start's lexicons are not this one's" in out and "replaced" in out, out
  assert "the earlier start's vocabulary is not this one" in out, out


@pytest.mark.parametrize("checkpointed", [False, True])
def test_config_json_options_of_a_dead_start_from_another_source_are_not_taken(tmp_path, checkpointed):
  """configs/finetune.py takes the model's shape from init_from; a dead start's config.json (another source's
  shape) decided it instead."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  other = tiny.train_config(str(tmp_path / "t.txt"))  # the dead start's source: the tiny shape
  (workdir / "config.json").write_text(json.dumps(other.to_dict()))
  c = _config("finetune")
  c.init_from = TFHUB_MODULE
  if checkpointed:
    _fake_checkpoint(str(workdir), other)
    resumed = variant.resolve(c, str(workdir)).options.to_dict()  # a resume: the shape it trained with
    assert resumed["lstm"]["dim"] == other.options.lstm.dim
    return
  module = variant.resolve(c, str(tmp_path / "fresh")).options.to_dict()
  assert variant.resolve(c, str(workdir)).options.to_dict() == module
  assert module["lstm"]["dim"] != other.options.lstm.dim


def test_held_is_a_readable_checkpoint(tmp_path):
  assert not derived.held(str(tmp_path / "checkpoints"))
  (tmp_path / "checkpoints" / "7").mkdir(parents=True)  # a step folder without its meta: not a checkpoint
  assert not derived.held(str(tmp_path / "checkpoints")) and derived.kept(str(tmp_path), "checkpoints") is None
  _fake_checkpoint(str(tmp_path), tiny.train_config("x"))
  assert derived.held(str(tmp_path / "checkpoints"))
  assert derived.kept(str(tmp_path), "checkpoints") == str(tmp_path / "checkpoints")
