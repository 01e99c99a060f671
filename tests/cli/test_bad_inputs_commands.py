"""The bad-input rows of the commands: outputs that would destroy inputs, messages that blamed the wrong
thing, and evaluation files of the wrong kind. Each is one line, before anything is written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from absl import app

import evaluate
from elmo_jax import cli
from elmo_jax.downstream import data as data_lib
from elmo_jax.embedding import inputs as embed_files
from elmo_jax.embedding import writer as embed
from elmo_jax.embedding.args import select_layers
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.evaluation import readers, tasks
from elmo_jax.formats import weights as weights_lib
from elmo_jax.runtime import files

from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT
from tiny import tiny_options
from eval_util import fake_models, pos_conll, sentiment_tsv, write


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """A folder with the tiny model's options.json + weights.hdf5 (no softmax, like released ELMo)."""
  folder = tmp_path_factory.mktemp("model")
  emb = Embedder.random(tiny_options(), seed=0)
  (folder / "options.json").write_text(json.dumps(emb.options))
  weights_lib.save_hdf5(folder / "weights.hdf5", emb.params, emb.options)
  return folder


@pytest.fixture(scope="module")
def emb(model_dir):
  return Embedder.from_files(model_dir / "options.json", model_dir / "weights.hdf5")


def _one_line(e) -> str:
  msg = str(e.value)
  assert "\n" not in msg, msg
  return msg


# --- 1. outputs that destroy inputs ----------------------------------------------------------------------
def test_embed_file_refuses_an_output_that_is_an_input_or_a_model_file(tmp_path, emb, model_dir):
  inp = write(tmp_path / "in.txt", "the cat sat\na dog\n")
  before = open(inp, "rb").read()
  link = tmp_path / "link.hdf5"
  os.symlink(inp, link)
  weights_before = files.sha256_file(model_dir / "weights.hdf5")
  for output, named in ((inp, inp), (link, inp), (model_dir / "weights.hdf5", "weights.hdf5"),
                        (model_dir / "options.json", "options.json")):
    with pytest.raises(files.UnsafeOutputError) as e:
      embed.embed_file(emb, inp, output, progress_every=None)
    assert "is an input of this run" in _one_line(e) and named in str(e.value)
    assert isinstance(e.value, embed_files.EmbedInputError)  # the CLI's and older callers' except still apply
  assert open(inp, "rb").read() == before and files.sha256_file(model_dir / "weights.hdf5") == weights_before
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "link.hdf5"]
  # A trained run's export/ is read by other commands: refused even for a new name.
  run = tmp_path / "run"
  (run / "export").mkdir(parents=True)
  (run / "config.json").write_text("{}")
  with pytest.raises(files.UnsafeOutputError, match="inside the trained run .*export/ folder"):
    embed.embed_file(emb, inp, run / "export" / "new.hdf5", progress_every=None)
  # --dump_token_embeddings over its own vocabulary, or over the token file the embedder reads.
  vocab = write(tmp_path / "vocab.txt", "the\ncat\n")
  with pytest.raises(files.UnsafeOutputError, match="is an input of this run"):
    embed.dump_token_embeddings(emb, vocab, vocab)
  assert open(vocab).read() == "the\ncat\n"
  tokens = tmp_path / "tokens.hdf5"
  embed.dump_token_embeddings(emb, vocab, tokens)
  cached = Embedder.from_files(model_dir / "options.json", model_dir / "weights.hdf5", token_embedding_file=tokens)
  with pytest.raises(files.UnsafeOutputError, match="tokens.hdf5"):
    embed.embed_file(cached, inp, tokens, progress_every=None)
  with pytest.raises(files.UnsafeOutputError, match="tokens.hdf5"):
    cached.dump_token_embeddings(["a"], tokens)


@pytest.mark.slow
def test_embed_command_refuses_an_output_that_is_an_input_in_one_line(tmp_path):
  inp = write(tmp_path / "in.txt", "the cat\n")
  weights = tmp_path / "w.hdf5"
  shutil.copy(FIXTURE_WEIGHTS, weights)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}

  def cli_run(*args):
    return subprocess.run([sys.executable, "-m", "elmo_jax", "embed", f"--options_file={FIXTURE_OPTIONS}",
                           f"--weight_file={weights}", *args], capture_output=True, text=True, timeout=120, env=env)

  for args, named in (([f"--input_file={inp}", f"--output_file={inp}"], inp),
                      ([f"--input_file={inp}", f"--output_file={weights}"], str(weights)),
                      (["--dump_token_embeddings", f"--vocab_file={inp}", f"--output_file={inp}"], inp)):
    proc = cli_run(*args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --output_file=") and "is an input of this run" in lines[0]
    assert named in lines[0]
  assert open(inp).read() == "the cat\n" and files.sha256_file(weights) == files.sha256_file(FIXTURE_WEIGHTS)
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "w.hdf5"]


def _eval_files(tmp_path):
  rng = np.random.default_rng(0)
  return (write(tmp_path / "train.conll", pos_conll(rng, 30)), write(tmp_path / "test.conll", pos_conll(rng, 10)))


def test_evaluate_refuses_an_output_dir_that_is_a_file_read_only_an_input_or_in_a_run(tmp_path, parsed_flags):
  train, test = _eval_files(tmp_path)
  pos = ["--task=pos", f"--train_file={train}", f"--test_file={test}"]
  cases = [(train, "--output_dir=.* is a file, not a directory")]
  # A file the task writes there (pos.json) that is an input.
  (tmp_path / "out").mkdir()
  os.symlink(train, tmp_path / "out" / "pos.json")
  cases.append((str(tmp_path / "out"), r"--output_dir=.*/out/pos.json is an input of this run"))
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text("{}")
  cases.append((str(run / "checkpoints" / "eval"), "--output_dir=.* is inside the trained run .*checkpoints/ folder"))
  for output_dir, message in cases:
    parsed_flags(*pos, f"--output_dir={output_dir}")
    with pytest.raises(SystemExit, match=f"evaluate.py: error: {message}") as e:
      evaluate.main(["evaluate.py"], load_models=fake_models())
    assert "\n" not in str(e.value.code)
  assert os.path.islink(tmp_path / "out" / "pos.json") and not os.path.exists(run / "checkpoints" / "eval")
  # The probe API checks too (tasks.run), before reading or loading anything.
  cfg = tasks.EvalConfig(output_dir=train, pos_train_file=train, pos_test_file=test)
  loads = []
  with pytest.raises(files.UnsafeOutputError, match="is a file, not a directory"):
    tasks.run("pos", cfg, fake_models(loads))
  assert loads == []


def test_evaluate_read_only_output_dir_is_one_line(tmp_path, parsed_flags):
  train, test = _eval_files(tmp_path)
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o555)
  # Root writes through any mode bits; sysfs refuses even root.
  out = "/sys/elmo_jax_test/out" if os.geteuid() == 0 else f"{locked}/out"
  try:
    parsed_flags("--task=pos", f"--train_file={train}", f"--test_file={test}", f"--output_dir={out}")
    with pytest.raises(SystemExit, match="is not writable"):
      evaluate.main(["evaluate.py"], load_models=fake_models())
  finally:
    locked.chmod(0o755)


def test_downstream_refuses_a_workdir_that_is_the_bilm_or_holds_an_input(tmp_path):
  train = write(tmp_path / "train.tsv", "1\tgood film .\n0\tbad film .\n")
  test = write(tmp_path / "test.tsv", "1\tgood .\n")
  paths = {"train": train, "dev": None, "test": test}
  bilm = tmp_path / "bilm"
  bilm.mkdir()
  with pytest.raises(files.UnsafeOutputError, match="--workdir=.*bilm is an input of this run"):
    data_lib.check_outputs(str(bilm), paths, str(bilm))
  with pytest.raises(files.UnsafeOutputError, match="--workdir=.* is a file, not a directory"):
    data_lib.check_outputs(train, paths)
  os.symlink(train, tmp_path / "results.json")  # the run would write results.json over the train file
  with pytest.raises(files.UnsafeOutputError, match="results.json is an input of this run"):
    data_lib.check_outputs(str(tmp_path), paths)
  with pytest.raises(files.UnsafeOutputError, match="--layer_cache_dir=.* is a file"):
    data_lib.check_outputs(str(tmp_path / "new"), paths, layer_cache_dir=test)
  data_lib.check_outputs(str(tmp_path / "new"), paths, str(bilm), str(tmp_path / "layers"))  # fine


# --- 2. messages that blame the wrong thing ---------------------------------------------------------------
def test_perplexity_of_a_model_without_softmax_says_so_and_all_skips_it(tmp_path, model_dir, parsed_flags,
                                                                          capsys):
  text = write(tmp_path / "text.txt", "the cat sat .\n")
  common = [f"--model={model_dir}", f"--text_file={text}", f"--output_dir={tmp_path}/out"]
  parsed_flags("--task=perplexity", *common)
  with pytest.raises(SystemExit, match="has no softmax") as e:  # not "vocab.txt: file not found"
    evaluate.main(["evaluate.py"], load_models=fake_models())
  assert "vocab.txt" not in str(e.value.code)
  train, test = _eval_files(tmp_path)
  parsed_flags("--task=all", *common, f"--pos_train_file={train}", f"--pos_test_file={test}",
               "--probe_max_epochs=2")
  capsys.readouterr()
  evaluate.main(["evaluate.py"], load_models=fake_models())
  out = capsys.readouterr().out
  skips = [line for line in out.splitlines() if line.startswith("perplexity: skipped")]
  assert len(skips) == 1 and "has no softmax" in skips[0], out
  assert os.path.exists(tmp_path / "out" / "pos.json") and os.path.exists(tmp_path / "out" / "report.md")


def test_downstream_hold_out_that_leaves_one_label_is_named(tmp_path):
  path = write(tmp_path / "train.tsv", "1\tgood film .\n0\tbad film .\n")
  split = data_lib.read_split("sentiment", "train", path)
  rest, dev = data_lib.hold_out(split, 0.1)
  assert len(rest.tokens) == 1 and len(dev.tokens) == 1
  with pytest.raises(readers.InputError) as e:
    data_lib.label_ids("sentiment", rest)
  msg = _one_line(e)
  assert "dev hold-out took 1 of 2" in msg and "--dev_fraction=0.1" in msg and "--dev=FILE" in msg, msg
  # A file with one label is still the file's fault, not the hold-out's.
  one = data_lib.read_split("sentiment", "train", write(tmp_path / "one.tsv", "1\ta .\n1\tb .\n1\tc .\n"))
  with pytest.raises(readers.InputError, match=r"needs >= 2 labels, got \['1'\]$"):
    data_lib.label_ids("sentiment", data_lib.hold_out(one, 0.1)[0])


def test_sentence_vectors_names_itself_for_a_str(emb):
  with pytest.raises(TypeError, match=r"sentence_vectors takes a list of sentences, got a str \('hello world'\)"):
    emb.sentence_vectors("hello world")
  with pytest.raises(TypeError, match=r"sentence 0 is a str \('hello world'\)"):
    emb.sentence_vectors(["hello world"])


@pytest.mark.parametrize("layer", [True, False, np.bool_(True), [True, False, True]])
def test_a_bool_layer_is_refused(emb, layer):
  with pytest.raises((ValueError, TypeError), match="layer must be 'all', 'top', 'average', an int"):
    emb.sentence_vectors([["hello", "world"]], layer=layer)
  with pytest.raises((ValueError, TypeError), match="layer must be"):
    select_layers(np.zeros((3, 2, 12), np.float32), layer)
  assert emb.sentence_vectors([["hello", "world"]], layer=1).shape == (1, 12)  # an int still picks a layer
  with pytest.raises(ValueError, match="layer 3 is out of range: the model has 3 layers"):
    emb.sentence_vectors([["hello"]], layer=3)


def test_a_usage_error_is_one_line_without_the_docstring(monkeypatch, capsys):
  def main(argv):
    del argv
    raise app.UsageError("give at most one of --all, --top, --average")
  monkeypatch.setattr(sys, "argv", ["prog"])
  with pytest.raises(SystemExit) as e:
    cli.run_main(main, name="elmo_jax embed")
  assert e.value.code == 1
  assert capsys.readouterr().err == ("elmo_jax embed: error: give at most one of --all, --top, --average "
                                     "(--help for usage)\n")


@pytest.mark.slow
def test_embed_usage_error_is_one_line(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", "--top", "--average", f"--input_file={tmp_path}/i",
                         f"--output_file={tmp_path}/o.hdf5", "--model=small"], capture_output=True, text=True,
                        timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 1 and proc.stderr.splitlines() == [
      "elmo_jax embed: error: give at most one of --all, --top, --average, --mix_weights (--help for usage)"], proc.stderr
  assert proc.stdout == ""


# --- 3. an evaluation file of the wrong kind -------------------------------------------------------------
def test_a_sentiment_tsv_or_other_non_conll_file_is_refused_as_pos(tmp_path):
  rng = np.random.default_rng(0)
  sentiment = write(tmp_path / "sent.tsv", sentiment_tsv(rng, 20))
  with pytest.raises(readers.InputError) as e:
    readers.read_conll(sentiment)
  assert _one_line(e).startswith(f"{sentiment}:1: the TAG column holds spaces") and \
      "looks like a label<TAB>sentence file" in str(e.value)
  # The same through the probe task (before any model) and the downstream reader.
  cfg = tasks.EvalConfig(output_dir=str(tmp_path / "out"), pos_train_file=sentiment, pos_test_file=sentiment)
  loads = []
  with pytest.raises(readers.InputError, match="looks like a label<TAB>sentence file"):
    tasks.run("pos", cfg, fake_models(loads))
  assert loads == [] and not os.path.exists(tmp_path / "out")
  with pytest.raises(readers.InputError, match="looks like a label<TAB>sentence file"):
    data_lib.read_split("pos", "train", sentiment)
  cases = {
      "sentence\tlabel": ("the film was good\t1\n", ":1: the word column holds spaces"),
      "no breaks": ("".join(f"w{i}\tNN\n" for i in range(1500)),
                    f":{readers.MAX_SENTENCE_TOKENS + 1}: {readers.MAX_SENTENCE_TOKENS} lines without a blank line"),
      "absurd sentence": ("a\tDT\n\n" + "".join(f"w{i}\tNN\n" for i in range(1200)),
                          f":3: a sentence of more than {readers.MAX_SENTENCE_TOKENS} tokens"),
      "one column": ("the DT\ncat NN\n", ":1: expected 2 tab-separated columns (word, TAG), got 1: looks like "
                     "whitespace-separated text"),
      "wsd": ("bank\tnoun\tbank%1\t0\tbank of it\n", ":1: expected 2 tab-separated columns (word, TAG), got 5: "
              "looks like a WSD file"),
  }
  for name, (text, message) in cases.items():
    path = write(tmp_path / f"{name.replace(' ', '_')}.conll", text)
    with pytest.raises(readers.InputError) as e:
      readers.read_conll(path)
    assert _one_line(e).startswith(path + message), (name, str(e.value))
  with pytest.raises(readers.InputError, match="is an HDF5 file, not text"):
    readers.read_conll(FIXTURE_WEIGHTS)
  # The real format, with a trailing blank line and several blank lines between sentences, still reads.
  ok = readers.read_conll(write(tmp_path / "ok.conll", "The\tDT\ncat\tNN\n\n\n.\t.\n\n"))
  assert [s.tokens for s in ok] == [("The", "cat"), (".",)]


# --- 4. inputs and job folders of the wrong kind, counts out of range -------------------------------------
def test_embed_inputs_of_the_wrong_kind_are_one_line(tmp_path, emb, model_dir):
  """E15 (a directory as input: [Errno 21]), E09 (an HDF5 file as vocabulary: a bare UnicodeDecodeError;
  as input: 'invalid UTF-8 at byte 0'), E14 (OUTPUT.partial a file: [Errno 20] Not a directory)."""
  from elmo_jax.embedding import job as embed_job  # pylint: disable=g-import-not-at-top
  weights = str(model_dir / "weights.hdf5")
  out = tmp_path / "out.hdf5"
  with pytest.raises(embed_files.EmbedInputError) as e:
    embed.embed_file(emb, tmp_path, out, progress_every=None)
  assert _one_line(e) == f"{tmp_path}: is a directory, not a text file"
  with pytest.raises(embed_files.EmbedInputError) as e:
    embed.embed_file(emb, weights, out, progress_every=None)
  assert _one_line(e) == f"{weights}: is an HDF5 file, not text"
  with pytest.raises(embed_files.EmbedInputError) as e:
    embed.dump_token_embeddings(emb, weights, out)
  assert _one_line(e) == f"{weights}: is an HDF5 file, not text"
  inp = write(tmp_path / "in.txt", "the cat sat\n")
  partial = tmp_path / "out.hdf5.partial"
  partial.write_text("left here\n")
  with pytest.raises(embed_job.JobError) as e:
    embed.embed_file(emb, inp, out, progress_every=None)
  assert _one_line(e) == f"{partial} is a file, not an embedding job folder; delete it"
  partial.unlink()
  partial.mkdir()
  (partial / "parts").write_text("")
  with pytest.raises(embed_job.JobError, match=r"out.hdf5.partial/parts is a file, not an embedding job folder"):
    embed.embed_file(emb, inp, out, progress_every=None)
  assert not out.exists()


@pytest.mark.slow
def test_embed_command_inputs_of_the_wrong_kind_name_the_flag(tmp_path):
  """E09/E14/E15 through the command: one line naming the flag, before the model loads."""
  inp = write(tmp_path / "in.txt", "the cat\n")
  (tmp_path / "busy.hdf5.partial").write_text("")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  model = [f"--options_file={FIXTURE_OPTIONS}", f"--weight_file={FIXTURE_WEIGHTS}"]
  for args, line in (
      ([f"--input_file={tmp_path}", f"--output_file={tmp_path}/o.hdf5"],
       f"error: --input_file={tmp_path} is a directory, not a text file"),
      ([f"--input_file={FIXTURE_WEIGHTS}", f"--output_file={tmp_path}/o.hdf5"],
       f"error: --input_file={FIXTURE_WEIGHTS} is an HDF5 file, not text"),
      (["--dump_token_embeddings", f"--vocab_file={FIXTURE_WEIGHTS}", f"--output_file={tmp_path}/t.hdf5"],
       f"error: --vocab_file={FIXTURE_WEIGHTS} is an HDF5 file, not text"),
      ([f"--input_file={inp}", f"--output_file={tmp_path}/busy.hdf5"],
       f"error: {tmp_path}/busy.hdf5.partial is a file, not an embedding job folder; delete it")):
    proc = subprocess.run([sys.executable, "-m", "elmo_jax", "embed", *model, *args], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [line], proc.stderr
  assert sorted(os.listdir(tmp_path)) == ["busy.hdf5.partial", "in.txt"]


@pytest.mark.parametrize("flag, message", [
    ("--probe_max_epochs=0", "--probe_max_epochs must be >= 1, got 0"),
    ("--batch_size=0", "--batch_size must be >= 1, got 0"),
    ("--max_examples=0", "--max_examples must be >= 1, got 0"),
    ("--probe_learning_rate=0", "--probe_learning_rate must be a number > 0, got 0.0"),
    ("--probe_learning_rate=nan", "--probe_learning_rate must be a number > 0, got nan"),
])
def test_evaluate_counts_and_rates_out_of_range_are_refused_before_any_work(tmp_path, parsed_flags, flag,
                                                                          message):
  """V09: --probe_max_epochs=0 wrote untrained-probe results with exit 0."""
  train, test = _eval_files(tmp_path)
  parsed_flags("--task=pos", f"--train_file={train}", f"--test_file={test}", f"--output_dir={tmp_path}/out",
               flag)
  loads = []
  with pytest.raises(SystemExit) as e:
    evaluate.main(["evaluate.py"], load_models=fake_models(loads))
  assert e.value.code == f"evaluate.py: error: {message}"
  assert loads == [] and not os.path.exists(tmp_path / "out")


@pytest.mark.slow  # four subprocesses
def test_downstream_counts_and_fractions_out_of_range_are_one_line(tmp_path):
  """DS4 (--batch_size=0: a ValueError traceback), DS6 (--num_epochs=0: a TypeError after the work)."""
  rng = np.random.default_rng(0)
  train = write(tmp_path / "train.conll", pos_conll(rng, 20))
  test = write(tmp_path / "test.conll", pos_conll(rng, 5))
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  for flag, message in (("--batch_size=0", "--batch_size must be >= 1, got 0"),
                        ("--num_epochs=0", "--num_epochs must be >= 1, got 0"),
                        ("--dev_fraction=1", "--dev_fraction must be between 0 and 1 (exclusive), got 1.0"),
                        ("--dev_fraction=0", "--dev_fraction must be between 0 and 1 (exclusive), got 0.0")):
    proc = subprocess.run([sys.executable, "-m", "elmo_jax", "downstream", "--task=pos", f"--train={train}",
                           f"--test={test}", f"--workdir={tmp_path}/run", flag, "--noprogress"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO_ROOT)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"elmo_jax downstream: error: {message}"], proc.stderr
  assert not os.path.exists(tmp_path / "run")


def test_a_conll_file_given_as_sentiment_train_is_named(tmp_path):
  """V03: a POS CoNLL file as --sentiment_train_file read as label<TAB>sentence; the error blamed the test
  file ("test.tsv:1: unknown label '0'")."""
  rng = np.random.default_rng(0)
  conll = write(tmp_path / "train.conll", pos_conll(rng, 20))
  test = write(tmp_path / "test.tsv", sentiment_tsv(rng, 10))
  with pytest.raises(readers.InputError) as e:
    readers.read_labelled(conll)
  assert _one_line(e).startswith(f"{conll}: looks like a CoNLL word<TAB>TAG file")
  cfg = tasks.EvalConfig(output_dir=str(tmp_path / "out"), sentiment_train_file=conll, sentiment_test_file=test)
  loads = []
  with pytest.raises(readers.InputError, match=f"^{conll}: looks like a CoNLL word<TAB>TAG file"):
    tasks.run("sentiment", cfg, fake_models(loads))
  assert loads == []
  with pytest.raises(readers.InputError, match="looks like a CoNLL word<TAB>TAG file"):
    data_lib.read_split("sentiment", "train", conll)
  # Real label<TAB>sentence files still read: one-word sentences, and blank lines between rows.
  assert len(readers.read_labelled(test)) == 10
  assert len(readers.read_labelled(write(tmp_path / "short.tsv", "1\tgreat\n0\tawful\n1\tfine\n"))) == 3
  assert len(readers.read_labelled(write(tmp_path / "gaps.tsv", "1\tgreat\n\n0\tawful\n\n1\tfine\n"))) == 3
