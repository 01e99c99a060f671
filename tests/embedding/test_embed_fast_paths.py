"""The embedding path's shortcuts give the plain computation's numbers: char CNN over fewer char positions,
CNN chunks by width, LSTM steps that stop after the longest row, the persistent compilation cache."""
from __future__ import annotations

import gzip
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.data import chars
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.embedding.step import CNN_ROWS as _CNN_ROWS, char_widths as _char_widths
from elmo_jax.formats import options as options_lib
from elmo_jax.model import BiLM, BiLMConfig
from elmo_jax.model import lstm as lstm_mod

from tiny import tiny_options
from paths import FIXTURE_DIR, REPO_ROOT

# Tokens around each width boundary (need = n_positions + max width 7 <= 16/24/32), up to the 48-byte cut.
_TOKENS = ["a", "ab", "abcdefg", "abcdefgh", "abcdefghijklmno", "abcdefghijklmnop", "x" * 23, "y" * 24,
           "z" * 41, "w" * 42, "v" * 48, "u" * 60, "naïve", "日本語テキスト", ".", "<S>"]


def _wide_options():
  """Filters up to width 7 (as the released models) on a tiny biLM."""
  options = tiny_options()
  options["char_cnn"]["filters"] = [[1, 4], [3, 4], [5, 4], [7, 8]]
  return options_lib.validate(options)


@pytest.mark.slow
def test_char_widths_keep_char_cnn_exact():
  options = _wide_options()
  model = BiLM(BiLMConfig.from_options(options))
  ids = np.stack([chars.token_to_ids(t) for t in _TOKENS])
  params = jax.jit(model.init)(jax.random.key(3), ids[None])["params"]  # jitted: one compile, not one per op
  widths = _char_widths(ids, 7)
  assert list(widths[:4]) == [16, 16, 16, 24] and widths[6] == 32 and widths[7] == 50 and widths[10] == 50
  full = np.asarray(model.apply({"params": params}, ids, method=BiLM.embed_tokens))
  for k, width in enumerate(widths):
    cut = np.asarray(model.apply({"params": params}, ids[k:k + 1, :width], method=BiLM.embed_tokens))[0]
    np.testing.assert_allclose(cut, full[k], rtol=0, atol=1e-6, err_msg=_TOKENS[k])


@pytest.mark.slow
def test_embedder_matches_plain_bilm_across_chunks_and_widths():
  """> _CNN_ROWS distinct tokens of all widths, uneven lengths: same as BiLM on full char ids."""
  options = _wide_options()
  emb = Embedder.random(options, seed=1)
  rng = np.random.default_rng(0)
  vocab = _TOKENS + [f"tok{i}" * (1 + i % 5) for i in range(2 * _CNN_ROWS)]
  sentences = [[vocab[j] for j in rng.integers(0, len(vocab), n)] for n in (1, 3, 17, 30, 9, 26, 12)]
  got = emb.embed_sentences(sentences, batch_size=4)
  ids = chars.batch_to_ids(sentences)
  want = np.asarray(jax.jit(lambda x: emb.model.apply({"params": emb.params}, x)["layers"])(jnp.asarray(ids)))
  for i, s in enumerate(sentences):
    np.testing.assert_allclose(got[i], want[i, :, :len(s)], rtol=0, atol=2e-5)


@pytest.mark.parametrize("hoist_max_rows", [8, 0])  # the hoisted form at 3 rows, the fused one
def test_lstm_steps_matches_lstm_scan(hoist_max_rows, monkeypatch):
  from elmo_jax.model import lstm_step
  monkeypatch.setattr(lstm_step, "HOIST_MAX_ROWS", hoist_max_rows)
  rng = np.random.default_rng(0)
  t, d, b, i, h, p = 9, 2, 3, 5, 8, 6
  x = jnp.asarray(rng.normal(size=(t, d, b, i)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, i + p, 4 * h)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(d, 4 * h)), jnp.float32)
  w_p = jnp.asarray(rng.normal(size=(d, h, p)), jnp.float32)
  lengths = np.array([7, 2, 0])
  mask = jnp.asarray(np.arange(t)[:, None, None] < lengths[None, None, :]).repeat(d, 1)
  c0 = jnp.asarray(rng.normal(size=(d, b, h)), jnp.float32)
  h0 = jnp.asarray(rng.normal(size=(d, b, p)), jnp.float32)
  gx = lstm_mod.input_gates(jnp.transpose(x, (1, 2, 0, 3)), w[:, :i], bias)
  want, (wc, wh) = lstm_mod.lstm_scan(gx, w[:, i:], w_p, mask, c0, h0, 3.0, 3.0)
  weights = lstm_step.StepWeights(w[:, :i], w[:, i:], w_p, bias)
  got, (gc, gh) = jax.jit(lambda n: lstm_mod.lstm_steps(x, weights, mask, c0, h0, n, 3.0, 3.0))(7)
  for a, e in ((got, want), (gc, wc), (gh, wh)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=0, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(gc[:, 2]), np.asarray(c0[:, 2]))  # the empty row kept its state


def test_lstm_steps_hoisted_in_bfloat16_is_the_bfloat16_scan():
  """The hoisted form with bfloat16 matmuls rounds x @ W_x and adds the bias in float32 in the step, as the bf16
  `lstm_scan` does: the same numbers to bf16 rounding (equal on jax 0.10)."""
  from elmo_jax.model import lstm_step
  rng = np.random.default_rng(0)
  t, d, b, i, h, p = 9, 2, 3, 5, 8, 6
  x = jnp.asarray(rng.normal(size=(t, d, b, i)), jnp.float32)
  w = jnp.asarray(rng.normal(0, 0.5, size=(d, i + p, 4 * h)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(d, 4 * h)), jnp.float32)
  w_p = jnp.asarray(rng.normal(0, 0.5, size=(d, h, p)), jnp.float32)
  mask = jnp.asarray(np.arange(t)[:, None, None] < np.array([7, 2, 0])[None, None]).repeat(d, 1)
  c0, h0 = jnp.zeros((d, b, h)), jnp.zeros((d, b, p))
  gx = lstm_mod.input_gates_split(jnp.transpose(x, (1, 2, 0, 3)).astype(jnp.bfloat16), w[:, :i].astype(jnp.bfloat16))
  want, _ = lstm_mod.lstm_scan(gx, w[:, i:], w_p, mask, c0, h0, 3.0, 3.0, jnp.bfloat16, bias=bias)
  weights = lstm_step.StepWeights(w[:, :i], w[:, i:], w_p, bias)
  got, _ = jax.jit(lambda n: lstm_mod.lstm_steps(x, weights, mask, c0, h0, n, 3.0, 3.0, jnp.bfloat16))(7)
  assert b <= lstm_step.HOIST_MAX_ROWS
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=4e-3)


def test_compilation_cache_dir_from_environment():
  Embedder.random(tiny_options())
  assert jax.config.jax_compilation_cache_dir == os.environ["ELMO_JAX_CACHE"]
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0


def test_embedding_hands_freed_memory_back(monkeypatch):
  """`batches` releases the allocator's free pages every _TRIM_EVERY_ROWS sentences counted across calls and
  at the end of a pass of _TRIM_AFTER_PASS or more, never after each small call (a trim costs more than a
  sentence's device time) (elmo_jax/runtime/memory.py; a warm load trims once more, test_embed_latency.py); on
  glibc the call reaches malloc_trim."""
  from elmo_jax.embedding import embedder as embedder_lib
  from elmo_jax.runtime import memory
  calls = []
  monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append(1))
  monkeypatch.setattr(embedder_lib, "_TRIM_EVERY_ROWS", 4)
  monkeypatch.setattr(embedder_lib, "_TRIM_AFTER_PASS", 3)
  emb = Embedder.random(tiny_options(), seed=0)
  assert len(emb.embed_sentences([["a", "b"]] * 9, batch_size=1)) == 9
  assert len(calls) == 3  # batches 4 and 8, and the end of a pass of 9 >= 3 batches
  calls.clear()
  for _ in range(3):  # single-sentence calls: no trim until 4 sentences have run since the last
    emb.embed_sentences([["a"]])
  assert not calls
  emb.embed_sentences([["a"]])
  assert len(calls) == 1
  emb.embed_sentences([["a"], ["b"], ["c"]])  # one batch of three sentences counts three
  assert len(calls) == 1
  emb.embed_sentences([["d"]])
  assert len(calls) == 2
  monkeypatch.undo()
  memory.release_free_memory()  # the real call: a no-op off glibc, never an error


def test_token_rows_flush_keeps_pinned_rows_and_grows_for_a_big_batch():
  from elmo_jax.embedding.token_cache import TokenRows
  rows = TokenRows(4, pinned=["the", "a"])
  r, new = rows.assign(["the", "x", "y"])
  assert list(r) == [0, 2, 3] and list(new) == [1, 2] and rows.capacity == 6
  r, new = rows.assign(["y", "z"])  # fits: y cached, z new
  assert list(r) == [3, 4] and list(new) == [1]
  r, new = rows.assign(["p", "q", "a"])  # 2 new, 1 free row: the unpinned rows are dropped
  assert list(r) == [2, 3, 1] and list(new) == [0, 1] and rows.rows.keys() == {"the", "a", "p", "q"}
  r, new = rows.assign([f"w{i}" for i in range(9)] + ["the"])  # more new tokens than the table holds
  assert rows.capacity == 2 + 16 and list(new) == list(range(9)) and list(r) == list(range(2, 11)) + [0]


@pytest.mark.slow
def test_cnn_cache_across_batches_is_exact_through_flushes_and_growth():
  """A token's char-CNN output computed in an earlier batch (or chunk, or after the table was emptied or
  grown) is the same numbers as computing it in its own batch, to XLA:CPU's rounding of a row by the shape of
  the call it is in (a call of a few new tokens is one small chunk at their widest width, `width_chunks`), and
  the same bits whenever the same calls are made."""
  options = _wide_options()
  rng = np.random.default_rng(5)
  vocab = _TOKENS + [f"tok{i}" * (1 + i % 4) for i in range(150)]
  sentences = [[vocab[j] for j in rng.integers(0, len(vocab), n)] for n in rng.integers(1, 40, 24)]
  fresh = Embedder.random(options, seed=2)
  rows = fresh._token_rows[0]  # pylint: disable=protected-access  (its one device)
  assign = rows.assign
  rows.assign = lambda tokens: (rows.clear(), assign(tokens))[1]  # every batch's tokens through the CNN
  want = fresh.embed_sentences(sentences, batch_size=4)
  for cache in (1 << 15, 40, 1):  # roomy; emptied between batches; grown by every batch
    emb = Embedder(options, fresh.params, cnn_cache_tokens=cache)  # the same random init, traced once
    passes = [emb.embed_sentences(sentences, batch_size=4) for _ in range(2)]  # the second finds the first's tokens
    for got, expected in zip([*passes[0], *passes[1]], [*want, *want]):
      np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    again = Embedder(options, fresh.params, cnn_cache_tokens=cache)
    for got, expected in zip(again.embed_sentences(sentences, batch_size=4), passes[0]):
      np.testing.assert_array_equal(got, expected)


def test_token_embeddings_equal_the_full_width_char_cnn():
  """`dump_token_embeddings`' values (the token table's path: by width, in chunks) vs `embed_vocab`."""
  from elmo_jax.model import embed_vocab
  options = _wide_options()
  emb = Embedder.random(options, seed=4)
  vocab = _TOKENS + [f"w{i}" * (1 + i % 6) for i in range(90)]
  done = []
  got = emb.token_embeddings(vocab, batch_size=70, on_batch=done.append)
  assert done == [70, len(vocab) - 70]
  np.testing.assert_allclose(got, embed_vocab(emb.config, emb.params, vocab)[1:], rtol=0, atol=1e-6)


def test_entry_points_keep_freed_memory_for_reuse():
  """glibc takes the settings (a fresh process: they are process-wide), and every console script's `run`
  starts through `cli.run_main`, which applies them before anything else (before JAX allocates)."""
  import ast
  import subprocess
  import sys
  import tomllib
  code = "from elmo_jax.runtime import memory; print(memory.reuse_freed_memory())"
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=True).stdout.strip() == "True"
  repo = REPO_ROOT
  scripts = tomllib.load(open(os.path.join(repo, "pyproject.toml"), "rb"))["project"]["scripts"]
  assert scripts == {"elmo-jax": "elmo_jax.cli:main"}  # the one console script: the dispatcher of COMMANDS
  from elmo_jax import cli  # pylint: disable=g-import-not-at-top
  for module in [m for name, (m, _) in cli.COMMANDS.items() if name != "prepare"]:  # prepare: no JAX arrays
    tree = ast.parse(open(os.path.join(repo, *module.split(".")) + ".py").read())
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    assert ast.unparse(run.body[0]).startswith("cli.run_main(main"), module
  tree = ast.parse(open(os.path.join(repo, "elmo_jax", "cli", "__init__.py")).read())
  run_main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_main")
  assert ast.unparse(run_main.body[1]) == "memory.reuse_freed_memory()"  # body[0] is the docstring


def test_a_cleared_token_table_gives_a_fresh_embedders_bits():
  """XLA:CPU rounds a char-CNN row by where it sits in its chunk (~1e-7), so a token's output depends on the
  tokens it was first computed with: after other sentences, some of the next ones differ in the last bits
  from a fresh Embedder's (measured: 4 of 100 after 800). `clear_token_table`, what a resumable job does
  at each part, removes that."""
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "train.txt.gz"), "rt") as f:
    lines = [next(f).split() for _ in range(360)]
  before, after = lines[:300], lines[300:]
  fixture = FIXTURE_DIR
  files = (os.path.join(fixture, "options.json"), os.path.join(fixture, "lm_weights.hdf5"))
  fresh = Embedder.from_files(*files).embed_sentences(after)
  used = Embedder.from_files(*files)
  used.embed_sentences(before)
  used.clear_token_table()
  for a, b in zip(fresh, used.embed_sentences(after)):
    np.testing.assert_array_equal(a, b)
