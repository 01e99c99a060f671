"""A warm Embedder (the default outside the test suite) compiles nothing after load for any length (a sentence
past its longest time bucket runs in stretches, `long_sentence`), and gives the bits of the path that compiles as
it goes (main's programs: the char CNN, the gather and the biLM as separate programs over the finer time
buckets; an Embedder with warm=False for long sentences)."""
from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from elmo_jax.embedding import host_batch
from elmo_jax.embedding import long_sentence
from elmo_jax.embedding import row_state
from elmo_jax.embedding import step as embed_step
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.runtime.compile_count import CompileCounter

from paths import REPO_ROOT
from tiny import tiny_options

_WORDS = "the bank of a river flooded she sat on it money is in plant trees near naïve 日本語 .".split()


def _sentence(n: int, k: int = 0) -> list[str]:
  return [_WORDS[(k + 3 * i) % len(_WORDS)] + ("s" * ((k + i) % 3)) for i in range(n)]


_BATCH = 4  # sentences per batch: rows 1, 2, 4 and three time buckets to warm (the product's 64: 7 row counts)


@pytest.fixture(scope="module")
def params():
  return Embedder.random(tiny_options(), seed=5, warm=False).params


@pytest.fixture(scope="module")
def warm(params):
  return Embedder(tiny_options(), params, warm=True, batch_size=_BATCH)


# Lengths 1 to 5,000: every bucket's edges, a stretch's edges (a sentence of n tokens reads n + 2 steps), a stride
_EDGES = {b + d for b in (*host_batch.WARM_TIME_BUCKETS, 2 * long_sentence.STRETCH) for d in (-3, -2, -1, 0, 1, 2)}
_LENGTHS = sorted({*range(1, 5001, 97), *_EDGES, 5000})


def _calls(emb: Embedder, lengths=_LENGTHS) -> None:
  """Sentences of every length in `lengths`, alone and in batches with long and short ones, every row count."""
  for n in lengths:
    emb.embed_sentences([_sentence(n, n)])
  mixed = [_sentence(n, n) for n in (1, 5, 33, 129, 2, 64, 7, 0, 12, 700)]
  for k in range(1, len(mixed) + 1):
    emb.embed_sentences(mixed[:k])
  emb.sentence_vectors(mixed, "top")


@pytest.mark.slow
def test_warm_embedder_compiles_nothing_after_load_at_any_length(warm):
  with CompileCounter() as compiles:
    _calls(warm, [n for n in _LENGTHS if n <= 1100] + [5000])
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()
  got = warm.embed_sentences([_sentence(3), _sentence(2000, 1), _sentence(9)])
  assert [g.shape[1] for g in got] == [3, 2000, 9] and all(np.isfinite(g).all() for g in got)
  assert all(g.base is None for g in got)  # each its own array: no view keeps a padded batch alive


@pytest.mark.slow
def test_warm_embedders_compile_nothing_after_load_for_every_length_to_5000(warm, params):
  stateful = Embedder(tiny_options(), params, stateful=True, warm=True, batch_size=_BATCH)
  with CompileCounter() as compiles:
    _calls(warm)
    _calls(stateful)
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()


@pytest.mark.slow
def test_every_length_to_5000_plans_only_shapes_compiled_at_load(warm):
  """Every length from 1 to 5,000, one sentence a call (the tests above run ~90 of them end to end, stateless and
  stateful, with 0 compiles): the host side of the call (`_prepare`, the same for both) plans only shapes a warm
  load compiles (`Steps.warm`): one row at a warm time bucket, or a long sentence's stretches (one shape whatever
  its length); char-CNN chunks of a warmed width and size. The token table is cleared before each call, so
  every call plans its tokens as new; three calls of distinct tokens plan several chunks."""
  # pylint: disable=protected-access
  devices = warm._steps.mesh.size
  warmed_chunks = {(devices * r, w) for w in embed_step.widths(warm.config.token_width)
                   for r in embed_step.CNN_CHUNK_ROWS}
  planned = collections.Counter()
  sentences = [_sentence(n, n) for n in range(1, 5001)] + [[f"w{i}" for i in range(n)] for n in (65, 300, 5000)]
  try:
    for s in sentences:
      warm.clear_token_table()
      prepared = warm._prepare([s], None)
      long = warm._is_long(s)
      slots = 0 if warm.stateful else 2  # stateless rows hold a sentence's boundaries too (packed rows' form)
      assert long or prepared.positions.shape in {(devices, t + slots) for t in warm._time_buckets}, len(s)
      assert long == (len(s) > max(host_batch.WARM_TIME_BUCKETS)), len(s)
      assert {c.shape for c in prepared.chunks} <= warmed_chunks, len(s)
      planned["long" if long else prepared.positions.shape[1] - slots] += 1
      planned["chunks"] += len(prepared.chunks)
  finally:
    warm.clear_token_table()
  assert planned["long"] == 5000 - max(host_batch.WARM_TIME_BUCKETS) + 1 and planned["chunks"] > len(sentences)


@pytest.mark.slow
@pytest.mark.parametrize("stateful", [False, True])
def test_long_sentences_have_the_bits_of_the_compile_as_you_go_path(params, stateful):
  """600 and 2,000 tokens (and 513, a stretch and 3 steps), one sentence a call, stateful carrying each row's
  state through a long sentence into the next call; and in a batch beside short ones (whose rows are not padded
  to the long one's length)."""
  sequence = [_sentence(600, 1), _sentence(30, 2), _sentence(2000, 3), _sentence(513, 4)]
  warm = Embedder(tiny_options(), params, stateful=stateful, warm=True, batch_size=_BATCH)
  cold = Embedder(tiny_options(), params, stateful=stateful, warm=False, batch_size=_BATCH)
  with CompileCounter() as compiles:
    got = [warm.embed_sentences([s])[0] for s in sequence]
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()
  for i, (s, g) in enumerate(zip(sequence, got)):
    w = cold.embed_sentences([s])[0]
    assert g.shape == w.shape == (3, len(s), 12) and np.array_equal(g, w), f"sentence {i}"
  if not stateful:
    mixed = [_sentence(5, 1), _sentence(700, 2), _sentence(40, 3)]
    batch = next(warm.batches(mixed))[2]
    assert isinstance(batch, list) and [b.shape[1] for b in batch] == [5, 40, 700]  # each cut to its length
    for g, s in zip(warm.embed_sentences(mixed), mixed):  # its tokens met in another call: rounding apart
      np.testing.assert_allclose(g, cold.embed_sentences([s])[0], rtol=0, atol=1e-6)


def _main_path(emb: Embedder, sentences, batch_size: int, stateful: bool) -> list[np.ndarray]:
  """Main's embedding programs: new tokens into the table, then the gather and the biLM (separate programs)
  over `host_batch.TIME_BUCKETS`, in `batches`' order and row padding."""
  steps, out = emb._steps, [None] * len(sentences)  # pylint: disable=protected-access
  order = list(range(len(sentences)))
  if not stateful:
    order.sort(key=lambda i: len(sentences[i]))
  state = None
  for start in range(0, len(order), batch_size):
    chunk = order[start:start + batch_size]
    rows = min(batch_size, 1 << max(0, len(chunk) - 1).bit_length())  # stateful too: the rows past it keep state
    # pylint: disable=protected-access
    prepared = host_batch.prepare([sentences[i] for i in chunk], rows, emb._token_rows, emb._char_ids,
                                  host_batch.TIME_BUCKETS, emb._max_width, emb._pad)
    emb._write_new_tokens(prepared)
    tokens = steps.gather(emb._table, steps.put_rows(np.maximum(prepared.positions, 0)))
    mask = steps.put_rows(prepared.mask)
    if stateful:
      state = row_state.grown(state, emb.config, rows)
      first = jax.device_put(row_state.first_rows(state, rows), steps.state_sharding)
      layers, after = steps.bilm_stateful(emb.params, emb.constants, tokens, mask, first)
      state = row_state.advanced(state, after, len(chunk))
    else:
      layers = steps.bilm(emb.params, emb.constants, tokens, mask)
    for row, i in enumerate(chunk):
      out[i] = np.asarray(layers)[row, :, :len(sentences[i])]
  return out


@pytest.mark.slow
@pytest.mark.parametrize("stateful", [False, True])
def test_warm_path_outputs_are_bit_identical_to_mains_programs(params, warm, stateful):
  sentences = [_sentence(n, n) for n in (3, 17, 1, 40, 9, 0, 25, 130, 2, 8, 33, 16, 5)]
  reference = Embedder(tiny_options(), params, stateful=stateful, warm=False, batch_size=_BATCH)
  want = _main_path(reference, sentences, _BATCH, stateful)
  if stateful:
    warm = Embedder(tiny_options(), params, stateful=True, warm=True, batch_size=_BATCH)
  warm.clear_token_table()  # as a new Embedder: the char CNN sees the same chunks
  got = _one_a_row(warm, sentences)
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.shape == w.shape and np.array_equal(g, w), f"sentence {i}"
  cold = Embedder(tiny_options(), params, stateful=stateful, warm=False, batch_size=_BATCH)  # the embed command's
  for i, (g, w) in enumerate(zip(_one_a_row(cold, sentences), want)):
    assert np.array_equal(g, w), f"sentence {i} (warm=False)"
  # embed_sentences: stateless, sentences packed end to end in rows (tests/embedding/test_packing.py): a row's
  # position rounds it; stateful, one sentence a row (its state is the row's), the same bits
  warm.clear_token_table()
  warm.reset_state()
  for i, (g, w) in enumerate(zip(warm.embed_sentences(sentences), want)):
    np.testing.assert_allclose(g, w, rtol=0, atol=0 if stateful else 1e-6, err_msg=f"sentence {i}")


def _one_a_row(emb: Embedder, sentences) -> list[np.ndarray]:
  """`Embedder.batches` (the embed command's path): one sentence a row, in length order (stateless)."""
  out = [None] * len(sentences)
  for _, chunk, layers, _ in emb.batches(sentences, _BATCH):
    for row, i in enumerate(chunk):
      out[i] = np.array(layers[row][:, :len(sentences[i])])
  return out


@pytest.mark.slow
def test_stateful_single_sentences_run_one_row_and_continue_it(params, monkeypatch):
  """Stateful, one sentence a call: one row's LSTMs run (no call pads to the state's `batch_size` rows), row 0
  carries its state from call to call as in full batches (bilm-tf's semantics), and nothing compiles. The load
  hands what compiling freed back once, so no call's trim pays for it."""
  from elmo_jax.runtime import memory  # pylint: disable=g-import-not-at-top
  sentences = [_sentence(n, n) for n in (3, 17, 1, 40, 9, 25)]
  trims = []
  monkeypatch.setattr(memory, "release_free_memory", lambda: trims.append(1))
  warm = Embedder(tiny_options(), params, stateful=True, warm=True, batch_size=_BATCH)
  assert len(trims) == 1
  launched = []
  real = warm._launch  # pylint: disable=protected-access
  warm._launch = lambda prepared: launched.append(prepared.positions.shape[0]) or real(prepared)
  with CompileCounter() as compiles:
    got = [warm.embed_sentences([s])[0] for s in sentences]
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()
  assert launched == [1] * len(sentences)
  full = Embedder(tiny_options(), params, stateful=True, warm=False, batch_size=_BATCH)
  want = [layers[0, :, :len(s)] for s in sentences for _, _, layers, _ in full.batches([s], full_rows=True)]
  for i, (g, w) in enumerate(zip(got, want)):  # 1 row vs _BATCH rows: XLA:CPU may round a row by its batch
    np.testing.assert_allclose(g, w, atol=1e-6, rtol=0, err_msg=f"sentence {i}")


@pytest.mark.slow
def test_latency_benchmark_prints_its_keys(tmp_path):
  options = tmp_path / "options.json"
  options.write_text(json.dumps(tiny_options()))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "benchmarks")])}
  proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "embed_latency.py"),
                         f"--options_file={options}", "--calls=3", "--warmup=1", "--split_calls=2",
                         "--batch_sizes=1", "--allennlp_path=", "--nocold_cache"], capture_output=True, text=True, env=env,
                        timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout[proc.stdout.index("{"):])
  assert {"machine", "commit", "presets"} <= result.keys()
  custom = result["presets"]["custom"]
  assert custom["cold_cache"] is None  # --nocold_cache: the warm process alone (it compiles: the cache is new)
  assert {"load_s", "load_compiles", "first_call_s", "compiles_after_load"} <= custom["warm_cache"].keys()
  warm = custom["warm_cache"]
  for b in ("batch_1",):
    assert {"p50", "p95", "p99", "max", "max_over_p50"} <= warm[b]["ms"].keys()
  assert set(warm["typical_call"]["ms"]) == {"ids", "cnn", "bilm", "copy"}
  assert warm["typical_call"]["calls"]["tokens"] > 0 and warm["floor"]["p50_ms"] > 0
  assert warm["batch_1"]["ours_over_floor"] > 0 and {"8", "128"} <= warm["floor"]["by_length_ms"].keys()
  assert {"ms", "split_ms", "compile_s", "by_length"} <= warm["flax_ms"].keys() and "p50" in warm["stateful_ms"]["ms"]
  assert sum(band["calls"] for band in warm["batch_1"]["by_length"].values()) == 3  # every timed call in a band
  assert warm["compiles_after_load"]["compiles"] == 0


@pytest.mark.slow
def test_long_sentence_benchmark_embeds_without_compiling(tmp_path):
  options = tmp_path / "options.json"
  options.write_text(json.dumps(tiny_options()))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "benchmarks")]),
         "ELMO_JAX_CACHE": str(tmp_path / "cache")}
  proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "long_sentence.py"),
                         f"--options_file={options}", "--lengths=1500,600"], capture_output=True, text=True,
                        env=env, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout[proc.stdout.index("{"):])
  assert [r["length"] for r in result["lengths"]] == [600, 1500]  # both past the longest time bucket (512)
  for r in result["lengths"]:
    assert r["compiles"]["traces"] == r["compiles"]["compiles"] == 0
    assert r["peak_rss_mb"] >= r["rss_mb"] > 0 and r["layers_mb"] > 0
