"""The run's model, settled before anything is written: its options (given, or taken from `config.init_from`
by `configs/finetune.py`), an ELMoForManyLangs-style (EFML) model's lexicons, and the export format.

    config = variant.resolve(config, workdir)     # options complete, data.lexicon a folder, export_format set
    lex = variant.lexicon(config, workdir)        # the EFML lexicons, or None for bilm-tf's byte ids

An EFML-style model (`efml_export.is_efml_variant`: code points through char.dic, a word embedding from
word.dic, AllenNLP's highway and cell) is carried by the options (`BiLMConfig.from_options` reads the variant
from them), so a resume, the export, evaluate.py and the embed command see the same model; its lexicons live
in the workdir (`LEXICON_DIR/char.dic`, `word.dic`), copied there from the source's folder or built from the
training text (`config.data.lexicon="build"`, `data/lexicon.py`) when the run starts, read back on resume.
Refusals (`InitFromError`) are one line naming the config field.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

import ml_collections

from elmo_jax.data import lexicon as lexicon_lib
from elmo_jax.formats import efml_export
from elmo_jax.formats import options as options_lib
from elmo_jax.runtime import files
from elmo_jax.runtime import log
from elmo_jax.runtime import run_layout
from elmo_jax.runtime import storage
from elmo_jax.runtime import streams
from elmo_jax.runtime.run_layout import CHECKPOINTS, CONFIG_FILE
from elmo_jax.sources import convert
from elmo_jax.training import derived
from elmo_jax.training import init_from
from elmo_jax.training.init_from import InitFromError
from elmo_jax.data import TextSource, Tokenizer
from elmo_jax.data.sources import expand_paths, split_paths

LEXICON_DIR = run_layout.LEXICON_DIR  # in the workdir: char.dic, word.dic of an EFML-style run
BUILD = "build"


def _unset(options: dict[str, Any]) -> bool:
  """True when the config leaves the model's shape to `init_from` (configs/finetune.py: placeholders, and no
  char CNN filters, which no flag can set)."""
  return "filters" not in options.get("char_cnn", {})


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def _merge_source(given: dict[str, Any], source: dict[str, Any], path: str) -> dict[str, Any]:
  """`source`'s options; a value the config sets (not None) must equal the source's, else one line naming it."""
  want = _leaves(options_lib.validate(source, f"config.init_from={path}"))
  for key, value in _leaves(given).items():
    if value is None or key == "char_cnn.n_characters":
      continue
    theirs = want.get(key, "<unset>")
    if _plain(value) != _plain(theirs):
      raise InitFromError(f"config.options.{key}={_json(value)} asks for another shape than config.init_from={path}"
                          f" ({_json(theirs)}); configs/finetune.py takes the model's options from the source: "
                          "leave it unset")
  return source


def _json(value: Any) -> str:
  return json.dumps(value)


def _plain(value: Any) -> Any:
  """JSON's view of a value (tuples as lists; 3 == 3.0 as in options.json)."""
  return json.loads(json.dumps(value))


def _saved_options(workdir: str) -> dict[str, Any] | None:
  """The options of the workdir's config.json (a run a checkpoint holds: the caller asks `derived`), else None."""
  try:
    with open(os.path.join(workdir, CONFIG_FILE), encoding="utf-8") as f:
      options = json.load(f).get("options")
  except (OSError, ValueError, AttributeError):
    return None
  return options if isinstance(options, dict) and not _unset(options) else None


def _run_lexicon(path: str) -> str | None:
  """The lexicon folder of a run (its workdir, checkpoints/ or a step) that has one, else None."""
  path = os.path.abspath(os.path.expanduser(path))
  for folder in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
    if os.path.isfile(os.path.join(folder, LEXICON_DIR, lexicon_lib.CHAR_DIC)):
      return os.path.join(folder, LEXICON_DIR)
  return None


def resolve(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
  """A copy of `config` with the run's model settled: options (from init_from where the config leaves them
  unset), `data.lexicon` (an EFML source's folder), the EFML lexicon sizes (`lexicon="build"`), and
  `export_format`. Raises InitFromError (one line) before anything is written."""
  c = ml_collections.ConfigDict(config.to_dict())
  options, given_lexicon = c.options.to_dict(), config.data.get("lexicon", "")
  # What a started run saved (config.json's options, lexicon/) is read only where a checkpoint holds it
  # (`derived`): a start that died before its first one left another source's or text's guesses.
  local = None if storage.is_remote(workdir) or not derived.held(os.path.join(workdir, CHECKPOINTS)) else workdir
  if _unset(options):
    if not c.init_from:
      raise InitFromError("config.options leaves the model's shape to config.init_from, which is empty: give "
                          "--config.init_from=SOURCE (a run, ELMo files, an ELMoForManyLangs folder, a TF-Hub "
                          "module, a released name or URL)")
    saved = _saved_options(local) if local else None
    source, folder = (saved, None) if saved is not None else init_from.source_options(c.init_from)
    options = _merge_source(options, source, c.init_from)
    if folder is not None and not c.data.get('lexicon', ''):
      c.data.lexicon = folder
  elif c.init_from and not c.data.get('lexicon', ''):
    released = init_from.released_source(c.init_from)
    if released is not None and released.efml_dir is not None:
      c.data.lexicon = released.efml_dir
  if c.init_from and not c.data.get('lexicon', ''):  # an EFML-style run as the source: its lexicons
    c.data.lexicon = _run_lexicon(c.init_from) or ""
  if efml_export.is_efml_variant(options):
    options = _with_lexicon(options, c, local)
  elif c.data.get('lexicon', '') and not given_lexicon:  # found in the source: the user set no lexicon
    raise InitFromError(f"config.init_from={c.init_from} is an ELMoForManyLangs-style model (char.dic, word.dic), "
                        "but config.options is a bilm-tf-style shape (byte ids): continue it with "
                        "configs/finetune.py, which takes the model's options from the source")
  elif c.data.get('lexicon', ''):
    raise InitFromError(f"config.data.lexicon={c.data.get('lexicon', '')}: a char/word lexicon is for an ELMoForManyLangs-"
                        "style model (options.char_cnn.highway='allennlp', lstm.implicit_forget_bias=false); "
                        "this model reads bilm-tf's byte ids")
  c.options = ml_collections.ConfigDict(options_lib.validate(options, "config.options"))
  fmt = c.get('export_format', '') or ("efml" if efml_export.is_efml_variant(options) else "bilm-hdf5")
  problem = convert.format_problem(options, fmt)
  if problem:
    raise InitFromError(f"config.export_format={fmt}: {problem}")
  c.export_format = fmt
  return c


def _with_lexicon(options: dict[str, Any], c: ml_collections.ConfigDict, workdir: str | None) -> dict[str, Any]:
  """`options` with the char_vocab_size, n_words and special_ids of the run's lexicons; a config value that
  disagrees with them is refused in one line."""
  lex = lexicon(c, workdir, options)
  values = lex.option_values()
  cnn = options["char_cnn"]
  words = cnn.setdefault("word_embedding", {"n_words": 0, "dim": 0})
  for key, have, want in (("char_cnn.char_vocab_size", cnn.get("char_vocab_size"), values["char_vocab_size"]),
                          ("char_cnn.word_embedding.n_words", words.get("n_words"), values["n_words"])):
    if have and have != want:
      raise InitFromError(f"config.options.{key}={have}, but the lexicon of config.data.lexicon={c.data.get('lexicon', '')} "
                          f"has {want:,} entries")
  cnn["char_vocab_size"], words["n_words"] = values["char_vocab_size"], values["n_words"]
  cnn["special_ids"] = values["special_ids"]
  return options


def lexicon(c: ml_collections.ConfigDict, workdir: str | None, options: dict[str, Any] | None = None,
            checkpoints: str | None = None) -> lexicon_lib.Lexicon | None:
  """The run's EFML lexicons: the workdir's where a checkpoint holds the run (`derived.kept`; `checkpoints`:
  a bucket workdir's), else `config.data.lexicon`'s folder, else built from the training text ("build");
  None for a bilm-tf-style model."""
  options = options or c.options.to_dict()
  if not efml_export.is_efml_variant(options):
    return None
  max_chars = int(options["char_cnn"]["max_characters_per_token"])
  words = bool(options["char_cnn"].get("word_embedding", {}).get("dim"))
  saved = derived.kept(workdir, LEXICON_DIR, checkpoints) if workdir else None
  try:
    if saved and os.path.isfile(os.path.join(saved, lexicon_lib.CHAR_DIC)):
      return lexicon_lib.read(saved, max_chars, words)
    if c.data.get('lexicon', '') == BUILD:
      _check_text(c)  # before the build: a blank or binary text is the preflight's one line, not a traceback
      return _built(c.data.train_files, bool(c.data.pretokenized), max_chars, int(c.data.vocab_min_count),
                    int(c.data.vocab_max_size), words)
    if not c.data.get('lexicon', ''):
      raise InitFromError("config.options is an ELMoForManyLangs-style model but config.data.lexicon is empty: "
                          "give the folder of its char.dic and word.dic, or 'build' (from the training text)")
    return lexicon_lib.read(c.data.get('lexicon', ''), max_chars, words)
  except lexicon_lib.LexiconError as e:
    raise InitFromError(f"config.data.lexicon: {e}") from None


def _check_text(c: ml_collections.ConfigDict) -> None:
  """The training text the lexicons are built from is text (`files.text_problem`, as the preflight checks it,
  which comes later: it reads the options this settles) and not blank; one line naming the file."""
  why = " (config.data.lexicon='build' makes the lexicons from it)"
  try:
    paths = expand_paths(split_paths(c.data.train_files))
  except (FileNotFoundError, ValueError) as e:
    raise InitFromError(f"config.data.train_files: {e}{why}") from None
  for path in [p for p in paths if not files.is_stream(p)]:  # a stream: the preflight's one line
    problem = files.text_problem(path)
    if problem is None:
      with streams.open_text(path) as f:  # read until its first non-blank byte
        problem = None if any(b.strip() for b in iter(lambda: f.read(1 << 20), b"")) else "is empty (no non-blank line)"
    if problem is not None:
      raise InitFromError(f"config.data.train_files: {path} {problem}{why}")


@functools.lru_cache(maxsize=4)
def _built(train_files: str, pretokenized: bool, max_chars: int, min_count: int, max_size: int,
           words: bool) -> lexicon_lib.Lexicon:
  """The lexicons built from the training text; cached: a start settles its model twice (train's checks, the loop)."""
  source = TextSource(split_paths(train_files))
  tokenizer = Tokenizer(pretokenized=pretokenized)
  return lexicon_lib.build((tokenizer(source[i]) for i in range(len(source))), max_chars, min_count, max_size, words)


def save_lexicon(lex: lexicon_lib.Lexicon | None, workdir: str, checkpoints: str | None = None) -> None:
  """The run's lexicons into the workdir (process 0): what a resume and the export read. Kept where a
  checkpoint holds the run (they are what it trained with); else written whole, replacing an earlier start's
  (`derived`), with a line when they differ."""
  if lex is None or derived.kept(workdir, LEXICON_DIR, checkpoints):
    return
  folder = os.path.join(workdir, LEXICON_DIR)
  if os.path.isdir(folder) and _dic_texts(folder) != _dic_texts(None, lex):
    log.info(f"{folder}: the earlier start's lexicons are not this one's (the training data, its settings or "
             "the source changed since) and no checkpoint was trained with them: replaced")
  with files.atomic_dir(folder) as tmp:  # whole: no word.dic of an earlier start beside a char-only lexicon
    lex.save(tmp)


def _dic_texts(folder: str | None, lex: lexicon_lib.Lexicon | None = None) -> dict[str, str | None]:
  """{char.dic, word.dic: its text or None} of a lexicon folder, or of `lex` as it would be saved."""
  if lex is not None:
    return {lexicon_lib.CHAR_DIC: lexicon_lib.dic_text(lex.char2id),
            lexicon_lib.WORD_DIC: None if lex.word2id is None else lexicon_lib.dic_text(lex.word2id)}
  out = {}
  for name in (lexicon_lib.CHAR_DIC, lexicon_lib.WORD_DIC):
    try:
      with open(os.path.join(folder, name), encoding="utf-8") as f:
        out[name] = f.read()
    except (OSError, UnicodeDecodeError):
      out[name] = None
  return out
