"""Portable models (docs/portable-models.md): the `jax.export` artifact equals the Embedder bit for bit on CPU in a
fresh process and lowers for cuda and tpu; the ONNX model, run by onnxruntime in a process without jax, equals the
Embedder within 1e-5 on three model families (bilm-tf's fixture, an ELMoForManyLangs folder, a TF-Hub module)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from elmo_jax.data import chars
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.formats import onnx_export
from elmo_jax.formats import stablehlo
from elmo_jax.sources import convert

import efml_util
import launch_util
from paths import REPO_ROOT, TFHUB_MODULE

# The artifact against an Embedder call of many sentences (docs/portable-models.md): the Embedder packs them end to
# end into rows, and XLA:CPU rounds a row's values by its position and the call's row count (test_packing's bound).
PACKED_BOUND = 1e-6
_HEAVY = ("jax", "jaxlib", "flax", "torch", "tensorflow")
_EXAMPLE = os.path.join(REPO_ROOT, "examples", "onnx_embed.py")


def _sentences(fixture_sentences) -> list[list[str]]:
  """The fixture's sentences (1 to 20-odd tokens), an empty one and a `<S>` token among words."""
  return [s for row in fixture_sentences for s in row][:12] + [[], ["<S>", "über", "long" * 20]]


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=launch_util.env(1),
                        capture_output=True, text=True, timeout=300)


_LOAD_EXPORTED = """
import sys, numpy as np
from elmo_jax.formats import stablehlo
run, ids = stablehlo.load_exported(sys.argv[1]), np.load(sys.argv[2])
alone = [run(ids[i:i + 1])["layers"][0] for i in range(len(ids))]  # a sentence a call, padded as in the batch
np.savez(sys.argv[3], alone=np.stack(alone), **run(ids))
print(sorted(m for m in ("flax", "elmo_jax.model", "elmo_jax.embedding", "torch", "tensorflow") if m in sys.modules))
"""


def _real_sentences(n: int = 40) -> list[list[str]]:
  """The first `n` lines of the shipped corpus (4 to 98 tokens)."""
  with gzip.open(os.path.join(REPO_ROOT, "data", "pd-small", "train.txt.gz"), "rt", encoding="utf-8") as f:
    return [line.split() for _, line in zip(range(n), f)]


@pytest.mark.slow
def test_stablehlo_equals_the_embedder_bit_for_bit_in_a_fresh_process(request, tmp_path, fixture_options,
                                                                        fixture_params, fixture_sentences):
  """docs/portable-models.md's claims: a sentence a call, the artifact's layers are the Embedder's own a sentence a
  call, bit for bit; against an Embedder call of many sentences (which packs them end to end into rows, and
  XLA:CPU rounds a row by where it sits and how many rows the call has) and in a batch, within `PACKED_BOUND`."""
  if launch_util.rerun_under_product_codegen(request):  # the bits of the product's code generation
    return
  folder = str(tmp_path / "exported")
  os.makedirs(folder)
  stablehlo.write(folder, fixture_options, fixture_params)
  assert sorted(os.listdir(folder)) == ["model.stablehlo", "stablehlo.json", "weights.npz"]
  sentences = _sentences(fixture_sentences) + _real_sentences(40)
  np.save(tmp_path / "ids.npy", chars.batch_to_ids(sentences))
  done = _python(_LOAD_EXPORTED, folder, str(tmp_path / "ids.npy"), str(tmp_path / "out.npz"))
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip() == "[]"  # the loader needs jax and numpy, not the model's code
  out = np.load(tmp_path / "out.npz")
  emb = Embedder(fixture_options, fixture_params, devices=1)
  for i, (s, batched) in enumerate(zip(sentences, emb.embed_sentences(sentences))):
    # one sentence a call on both sides: the same bits (the time padding of either side changes none)
    np.testing.assert_array_equal(out["alone"][i, :, :len(s)], emb.embed_sentences([s])[0], err_msg=f"sentence {i}")
    # against the Embedder's call of all of them (packed rows), alone or in the artifact's own batch: the bound
    np.testing.assert_allclose(out["alone"][i, :, :len(s)], batched, rtol=0, atol=PACKED_BOUND, err_msg=f"{i}")
    np.testing.assert_allclose(out["layers"][i, :, :len(s)], batched, rtol=0, atol=PACKED_BOUND, err_msg=f"{i}")
    assert not out["layers"][i, :, len(s):].any() and out["mask"][i].sum() == len(s)


def test_stablehlo_lowers_for_cpu_cuda_and_tpu_with_symbolic_batch_and_time(tmp_path):
  to = tmp_path / "exported"
  convert.convert(TFHUB_MODULE, str(to), "stablehlo")  # docs/portable-models.md's command, in process
  loaded = stablehlo.load_exported(to)
  assert loaded.exported.platforms == ("cpu", "cuda", "tpu")
  assert [str(d) for d in loaded.exported.in_avals[-1].shape] == ["b", "t", "50"]
  meta = json.loads((to / "stablehlo.json").read_text())
  assert meta["platforms"] == ["cpu", "cuda", "tpu"] and meta["input"]["shape"] == ["batch", "time", 50]
  # a weights file that is not the module's: one line naming the file and the array
  flat = dict(np.load(to / "weights.npz"))
  good = flat["char_cnn/W_cnn_1"]
  flat["char_cnn/W_cnn_1"] = np.concatenate([good, good[:1]])
  np.savez(to / "weights.npz", **flat)
  shape = list(good.shape)
  wrong = (rf"weights\.npz: char_cnn/W_cnn_1 is float32 \[{shape[0] + 1}, {shape[1]}, {shape[2]}\], the module "
           rf"takes float32 \[{shape[0]}, {shape[1]}, {shape[2]}\]$")
  with pytest.raises(stablehlo.ExportedError, match=wrong):
    stablehlo.load_exported(to)
  os.remove(to / "model.stablehlo")
  with pytest.raises(stablehlo.ExportedError, match=r"no model\.stablehlo"):
    stablehlo.load_exported(to)


# The example in a process that must not import any of _HEAVY (it is run as a script, as a user would).
_RUN_EXAMPLE = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
  runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
  assert not e.code, e.code
print(sorted(m for m in %r if m in sys.modules))
""" % (_HEAVY,)


def _efml_folder(tmp_path) -> str:
  pytest.importorskip("torch", reason="the EFML model is written by ELMoForManyLangs' own modules")
  pytest.importorskip("elmoformanylangs", reason="the EFML model is written by ELMoForManyLangs' own modules")
  folder = str(tmp_path / "efml")
  efml_util.write_model(folder, zip_format=True)
  return folder


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bilm-tf", "efml", "tfhub"])
def test_onnx_equals_the_embedder_within_1e5_without_jax(tmp_path, family, fixture_options, fixture_params,
                                                         fixture_sentences):
  pytest.importorskip("onnx")
  pytest.importorskip("onnxruntime")
  to = str(tmp_path / "onnx")
  if family == "bilm-tf":
    os.makedirs(to)
    onnx_export.write(to, fixture_options, fixture_params)
    emb, sentences = Embedder(fixture_options, fixture_params, devices=1), _sentences(fixture_sentences)
  elif family == "efml":
    folder = _efml_folder(tmp_path)
    convert.convert(folder, to, "onnx")
    emb, sentences = Embedder.from_efml(folder, devices=1), [*efml_util.SENTENCES, [], ["<eos>", "中文"]]
  else:  # through the command, as a user converts
    done = subprocess.run([sys.executable, "-m", "elmo_jax", "convert", f"--from={TFHUB_MODULE}", f"--to={to}",
                           "--format=onnx"], cwd=REPO_ROOT, env=launch_util.env(1), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stderr.strip().endswith(f"wrote {to}: onnx of {TFHUB_MODULE}"), done.stderr
    emb, sentences = Embedder.from_pretrained(TFHUB_MODULE, devices=1), _sentences(fixture_sentences)
  assert sorted(os.listdir(to)) == ["model.onnx", "tokenizer.json"]
  text = tmp_path / "sentences.txt"
  text.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
  done = _python(_RUN_EXAMPLE, _EXAMPLE, to, str(text), str(tmp_path / "out.npz"), "--batch_size=5")
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.strip().splitlines()
  assert lines == [f"wrote {tmp_path / 'out.npz'}: {len(sentences)} sentences, {sum(map(len, sentences))} tokens",
                   "[]"]
  out = np.load(tmp_path / "out.npz")
  for i, want in enumerate(emb.embed_sentences(sentences)):
    assert out[str(i)].shape == want.shape
    np.testing.assert_allclose(out[str(i)], want, rtol=0, atol=1e-5, err_msg=f"{family} sentence {i}")


@pytest.mark.slow
def test_latency_benchmark_prints_its_keys():
  pytest.importorskip("onnxruntime")
  env = {**launch_util.env(1), "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "benchmarks")])}
  proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "benchmarks", "portable_latency.py"),
                         f"--options_file={os.path.join(REPO_ROOT, 'tests', 'fixtures', 'bilm_tf', 'options.json')}",
                         "--calls=4", "--warmup=1"], capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout[proc.stdout.index("{"):])
  assert result["batch"] == 1 and result["sentences"]["n"] == 4
  for name in ("embedder", "stablehlo", "onnx"):
    assert {"p50", "p95", "max"} <= result[name]["ms"].keys() and result[name]["ms"]["p50"] > 0
  assert result["onnx"]["p50_over_embedder"] > 0 and result["stablehlo"]["p50_over_embedder"] > 0
