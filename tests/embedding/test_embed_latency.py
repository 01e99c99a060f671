"""A warm Embedder (the default outside the test suite) compiles nothing after load, refuses a sentence past
its longest compiled length in one line, and gives the bits of the path that compiles as it goes (main's
programs: the char CNN, the gather and the biLM as separate programs over the finer time buckets)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from elmo_jax.embedding import host_batch
from elmo_jax.embedding import row_state
from elmo_jax.embedding.embedder import Embedder, LengthError
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


def _calls(emb: Embedder) -> None:
  """Sentences of every length up to the longest bucket (both sides of each edge), every row count."""
  top = host_batch.WARM_TIME_BUCKETS[-1]
  for n in [*range(1, top + 1, 7), top]:
    emb.embed_sentences([_sentence(n, n)])
  mixed = [_sentence(n, n) for n in (1, 5, 33, 129, 2, 64, 7, 0, 12)]
  for k in range(1, len(mixed) + 1):
    emb.embed_sentences(mixed[:k])
  emb.sentence_vectors(mixed, "top")


def test_warm_embedder_compiles_nothing_after_load_and_refuses_longer_sentences_in_one_line(warm):
  top = host_batch.WARM_TIME_BUCKETS[-1]
  with CompileCounter() as compiles:
    _calls(warm)
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()
  with pytest.raises(LengthError) as e:
    warm.embed_sentences([_sentence(3), _sentence(top + 1)])
  assert str(e.value).count("\n") == 0 and f"sentence 1 has {top + 1} tokens" in str(e.value)
  assert "warm=False" in str(e.value)


@pytest.mark.slow
def test_warm_stateful_embedder_compiles_nothing_after_load(params):
  stateful = Embedder(tiny_options(), params, stateful=True, warm=True, batch_size=_BATCH)
  with CompileCounter() as compiles:
    _calls(stateful)
  assert (compiles.traces, compiles.compiles) == (0, 0), compiles.as_dict()


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
      layers, after = steps.bilm_stateful(emb.params, tokens, mask, first)
      state = row_state.advanced(state, after, len(chunk))
    else:
      layers = steps.bilm(emb.params, tokens, mask)
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
  got = warm.embed_sentences(sentences)
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.shape == w.shape and np.array_equal(g, w), f"sentence {i}"
  cold = Embedder(tiny_options(), params, stateful=stateful, warm=False, batch_size=_BATCH)  # the embed command's
  for i, (g, w) in enumerate(zip(cold.embed_sentences(sentences), want)):
    assert np.array_equal(g, w), f"sentence {i} (warm=False)"


@pytest.mark.slow
def test_stateful_single_sentences_run_one_row_and_continue_it(params):
  """Stateful, one sentence a call: one row's LSTMs run (no call pads to the state's `batch_size` rows), row 0
  carries its state from call to call as in full batches (bilm-tf's semantics), and nothing compiles."""
  sentences = [_sentence(n, n) for n in (3, 17, 1, 40, 9, 25)]
  warm = Embedder(tiny_options(), params, stateful=True, warm=True, batch_size=_BATCH)
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
                         "--batch_sizes=1,4", "--allennlp_path="], capture_output=True, text=True, env=env,
                        timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout[proc.stdout.index("{"):])
  assert {"machine", "commit", "presets"} <= result.keys()
  custom = result["presets"]["custom"]
  for run in ("cold_cache", "warm_cache"):
    assert {"load_s", "load_compiles", "first_call_s", "compiles_after_load"} <= custom[run].keys()
  warm = custom["warm_cache"]
  for b in ("batch_1", "batch_4"):
    assert {"p50", "p95", "p99", "max", "max_over_p50"} <= warm[b]["ms"].keys()
  assert set(warm["split_ms"]) == {"ids", "dispatch", "device", "copy"}
  assert {"ms", "split_ms"} <= warm["flax_ms"].keys() and "p50" in warm["stateful_ms"]
  assert warm["compiles_after_load"]["compiles"] == 0
