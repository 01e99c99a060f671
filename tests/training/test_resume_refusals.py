"""A resume is refused in one line when the run would go on from something other than what it saved, and the
refusal leaves every file of the workdir as it was (issue 34): a training file edited in place at the same size
(its content, hashed once while its size, mtime and ctime stay), and a check only the restore can make (the
data position a checkpoint holds)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import launch_util
import tiny
from elmo_jax.data import Vocab
from elmo_jax.runtime import files, storage
from elmo_jax.training import input as input_lib, preflight


def _checkpointed(tmp_path, config) -> str:
  """A workdir whose checkpoint step 40 records `config` and its training text (the meta item only: what
  the preflight reads)."""
  workdir = tmp_path / "run"
  Vocab.build([s.split() for s in open(config.data.train_files)]).save(str(workdir))
  meta = workdir / "checkpoints" / "40" / "meta"
  meta.mkdir(parents=True)
  (meta / "metadata").write_text(json.dumps({
      "config": config.to_dict(), "vocab_sha256": Vocab.load(str(workdir / "vocab.txt")).sha256(), "data": [{}],
      "train_source": input_lib.train_source(config.data)}))
  return str(workdir)


def test_a_same_size_edit_of_a_training_file_is_refused_by_its_content(tmp_path, monkeypatch):
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  path = launch_util.write_corpus(str(tmp_path / "train.txt"))
  config = tiny.train_config(path)
  workdir = _checkpointed(tmp_path, config)
  hashed = []
  monkeypatch.setattr(files, "sha256_file", lambda p, real=files.sha256_file: hashed.append(p) or real(p))
  preflight.check_run(config, workdir, 1, 1)
  assert hashed == []  # hashed once, when the checkpoint's record was made: size, mtime and ctime unchanged
  st = os.stat(path)
  text = open(path).read()
  with open(path, "w") as f:  # a word's case swapped in place: the same size; the mtime set back as well
    f.write(text.replace("the", "The", 1))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert os.path.getsize(path) == st.st_size
  with pytest.raises(preflight.PreflightError, match=rf"^config.data.train_files: {re.escape(path)} changed since "
                     rf"\(the same {st.st_size:,} bytes, other content: sha256 \w{{12}} then, \w{{12}} now\) "
                     r"\(checkpoint step 40"):
    preflight.check_run(config, workdir, 1, 1)
  assert hashed == [os.path.realpath(path)]
  with open(path, "w") as f:  # set back: resumes again
    f.write(text)
  preflight.check_run(config, workdir, 1, 1)


def test_a_start_without_a_checkpoint_builds_its_vocabulary_again(tmp_path, monkeypatch, capsys):
  """A vocab.txt that an earlier start left without a checkpoint (killed before its first save) is only what
  that start built: a rerun on an edited text (the same size), other vocabulary settings or a given
  vocab_file trains with the vocabulary of its own data, saying so; with a checkpoint the saved one stays."""
  monkeypatch.setenv("ELMO_JAX_CACHE", str(tmp_path / "cache"))
  path = launch_util.write_corpus(str(tmp_path / "train.txt"))
  config = tiny.train_config(path, **{"data.vocab_max_size": 20})
  workdir = str(tmp_path / "run")
  first = input_lib.make_input(config, workdir, 4).vocab
  assert Vocab.load(workdir).sha256() == first.sha256()
  assert input_lib.make_input(config, workdir, 4).vocab.sha256() == first.sha256()
  assert "replaced" not in capsys.readouterr().out  # the same data: the same vocabulary, nothing to say
  text = open(path).read()
  word = next(w for w in first.tokens[3:] if w.islower() and w.isalpha())  # the most frequent word
  with open(path, "w") as f:  # its case swapped everywhere: the same size, another vocabulary
    f.write(re.sub(rf"\b{word}\b", word.upper(), text))
  assert os.path.getsize(path) == len(text.encode())
  edited = input_lib.make_input(config, workdir, 4).vocab
  assert word.upper() in edited.tokens and word not in edited.tokens
  assert Vocab.load(workdir).sha256() == edited.sha256()
  assert re.search(r"vocab.txt: the earlier start's vocabulary is not this one .* no checkpoint was trained "
                   r"with it: replaced", capsys.readouterr().out)
  wider = tiny.train_config(path, **{"data.vocab_max_size": 2000})
  preflight.check(wider, workdir)  # other settings: not refused, the rerun builds with them
  assert len(input_lib.make_input(wider, workdir, 4).vocab) > len(edited)
  given = tmp_path / "given_vocab.txt"
  given.write_text("<S>\n</S>\n<UNK>\nthe\n")
  own = tiny.train_config(path, **{"data.vocab_file": str(given)})
  assert input_lib.make_input(own, workdir, 4).vocab.tokens == ["<S>", "</S>", "<UNK>", "the"]
  _checkpointed(tmp_path, wider)  # a checkpoint now holds the run: its saved vocabulary stays
  assert input_lib.make_input(wider, workdir, 4).vocab.sha256() == Vocab.load(workdir).sha256()


@pytest.mark.slow
def test_a_resume_refused_while_restoring_leaves_the_workdir_as_it_was(tmp_path):
  """A checkpoint that verifies and whose config the preflight accepts, but whose data position the restore
  refuses (another iterator state version): one line, and no file of the workdir changed, config.json (this
  run's other learning rate) included."""
  train = launch_util.write_corpus(str(tmp_path / "train.txt"), n_lines=200)
  config = tiny.write_train_config(str(tmp_path / "tiny.py"), train, "", **{"num_train_steps": 2,
                                   "checkpoint_every_steps": 2, "eval_every_steps": 2, "log_every_steps": 1})
  command = [sys.executable, os.path.join(launch_util.REPO_ROOT, "train.py"), "--workdir=run", f"--config={config}"]
  train_py = lambda *flags: subprocess.run([*command, *flags], cwd=tmp_path, capture_output=True, text=True,  # noqa: E731
                                           env=launch_util.env(), timeout=300)
  proc = train_py()
  assert proc.returncode == 0, proc.stderr
  run = tmp_path / "run"
  step = run / "checkpoints" / "2"
  meta = json.loads((step / "meta" / "metadata").read_text())
  meta["data"][0]["version"] = -1
  (step / "meta" / "metadata").write_text(json.dumps(meta))
  (run / "checkpoints" / "checksums" / "2.json").write_text(json.dumps(
      {"step": 2, "sha256": storage.tree_digests(str(step), "sha256")}))  # it verifies: the bytes are "ours"
  snapshot = lambda: {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}  # noqa: E731
  before = snapshot()
  refused = train_py("--config.learning_rate=0.05", "--config.num_train_steps=4")
  last = refused.stderr.strip().splitlines()[-1]
  assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
  assert last.startswith("train: error: ") and "data iterator state version -1" in last, last
  assert snapshot() == before
