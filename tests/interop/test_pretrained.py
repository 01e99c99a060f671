"""Released models by name/URL and the download cache, against a local http.server (nothing leaves the machine)."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import http_util
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.runtime import files
from elmo_jax.sources import download
from elmo_jax.sources import pretrained
from http_util import dead_url, mirror, serve_models
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT

cache = http_util.cache


def test_download_once_then_offline(tmp_path, cache):
  (tmp_path / "www").mkdir()
  (tmp_path / "www" / "a.bin").write_bytes(os.urandom(3 << 20))  # > one read block
  with serve_models(tmp_path / "www") as (server, base):
    path = download.cached_path(f"{base}/a.bin")
    again = download.cached_path(f"{base}/a.bin")
    assert server.requests == ["/a.bin"]  # the second use did not touch the network
  assert path == again and os.path.dirname(path) == str(cache)
  assert open(path, "rb").read() == (tmp_path / "www" / "a.bin").read_bytes()
  manifest = json.loads((cache / "manifest.json").read_text())
  entry = manifest[f"{base}/a.bin"]
  assert entry["sha256"] == files.sha256_file(path) and entry["bytes"] == 3 << 20
  assert entry["source"] == "first download"
  # The server is gone: the cached copy still serves.
  assert download.cached_path(f"{base}/a.bin") == path
  assert not [n for n in os.listdir(cache) if n.endswith(".part")]


def test_corrupt_cached_file_is_moved_aside_and_fetched_again(tmp_path, cache):
  (tmp_path / "www").mkdir()
  data = os.urandom(10_000)
  (tmp_path / "www" / "w.bin").write_bytes(data)
  with serve_models(tmp_path / "www") as (server, base):
    path = download.cached_path(f"{base}/w.bin")
    with open(path, "r+b") as f:  # one flipped byte
      f.seek(5000)
      f.write(bytes([data[5000] ^ 0xFF]))
    capture = download.cached_path(f"{base}/w.bin")
    assert len(server.requests) == 2
  assert open(capture, "rb").read() == data
  aside = [n for n in os.listdir(cache) if ".corrupt-" in n]
  assert len(aside) == 1 and open(cache / aside[0], "rb").read() != data


def test_interrupted_download_leaves_nothing(tmp_path, cache):
  (tmp_path / "www").mkdir()
  with serve_models(tmp_path / "www") as (server, base):
    server.truncate.add("/big.hdf5")
    os.makedirs(cache)
    with open(download.cache_file(f"{base}/big.hdf5") + ".x1y2.part", "wb") as f:  # a kill -9's leftover
      f.write(b"partial")
    with pytest.raises(download.DownloadError, match=r"incomplete \(100 of 1000 bytes\)"):
      download.cached_path(f"{base}/big.hdf5")
  assert not os.path.exists(download.cache_file(f"{base}/big.hdf5"))
  assert sorted(os.listdir(cache)) == ["manifest.json.lock"]


def test_offline_without_copy_is_one_actionable_line(cache):
  url = dead_url("elmo_weights.hdf5")
  with pytest.raises(download.DownloadError) as e:
    download.cached_path(url, timeout=5)
  message = str(e.value)
  assert "\n" not in message and url in message and download.cache_file(url) in message
  # A file put there by hand is used (and its hash recorded).
  target = download.cache_file(url)
  shutil.copy(FIXTURE_WEIGHTS, target)
  assert download.cached_path(url) == target
  assert json.loads((cache / "manifest.json").read_text())[url]["source"] == "found in cache"


def test_published_hash_mismatch_and_match(tmp_path, cache):
  (tmp_path / "www").mkdir()
  (tmp_path / "www" / "o.json").write_text("{}")
  good = files.sha256_file(str(tmp_path / "www" / "o.json"))
  with serve_models(tmp_path / "www") as (_, base):
    with pytest.raises(download.DownloadError, match="published sha256"):
      download.cached_path(f"{base}/o.json", sha256="0" * 64)
    assert not os.path.exists(download.cache_file(f"{base}/o.json"))
    assert sorted(os.listdir(cache)) == ["manifest.json.lock"]  # no temp, nothing moved aside
    path = download.cached_path(f"{base}/o.json", sha256=good)
  assert json.loads((cache / "manifest.json").read_text())[f"{base}/o.json"]["source"] == "published"
  assert open(path).read() == "{}"


def test_file_urls_and_paths_are_used_in_place(tmp_path):
  assert download.cached_path("file://" + os.path.abspath(FIXTURE_WEIGHTS)) == os.path.abspath(FIXTURE_WEIGHTS)
  assert download.cached_path(FIXTURE_WEIGHTS) == FIXTURE_WEIGHTS
  assert not download.is_url(FIXTURE_WEIGHTS) and download.is_url("https://x/y")


def test_released_table():
  assert list(pretrained.MODELS) == ["small", "medium", "original", "original_5.5B"]
  m = pretrained.MODELS["original"]
  assert m.weight_url == ("https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/"
                          "elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5")
  assert pretrained.MODELS["original_5.5B"].options_url.endswith(
      "2x4096_512_2048cnn_2xhighway_5.5B/elmo_2x4096_512_2048cnn_2xhighway_5.5B_options.json")
  with open(os.path.join(REPO_ROOT, "docs", "released-models.md")) as f:
    readme = f.read()
  for model in pretrained.MODELS.values():  # the docs' table is this table
    assert model.options_url in readme and model.weight_url in readme


def test_from_pretrained_by_name_url_and_folder(tmp_path, cache, monkeypatch):
  mirror(tmp_path / "www")
  key = pretrained.MODELS["small"].key
  fixture = (files.sha256_file(FIXTURE_OPTIONS), files.sha256_file(FIXTURE_WEIGHTS))
  with serve_models(tmp_path / "www") as (server, base):
    monkeypatch.setenv("ELMO_JAX_MODELS_URL", base)
    emb = Embedder.from_pretrained("small")
    assert len(server.requests) == 2
    by_url = pretrained.resolve(f"{base}/{key}/elmo_{key}_options.json")  # weights found beside it
    assert len(server.requests) == 2  # same URLs: served from the cache
  for pair in (by_url, pretrained.resolve("small"),  # offline now: the cache serves
               pretrained.resolve(str(tmp_path / "www" / key)),
               pretrained.resolve("file://" + str(tmp_path / "www" / key))):
    assert tuple(files.sha256_file(p) for p in pair) == fixture
  want = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS).embed_sentences([["The", "bank", "."], ["Hi"]])
  for got, ref in zip(emb.embed_sentences([["The", "bank", "."], ["Hi"]]), want):
    np.testing.assert_array_equal(got, ref)


def test_resolve_errors(tmp_path, cache):
  with pytest.raises(download.DownloadError, match="not a released model"):
    pretrained.resolve("huge")
  (tmp_path / "empty").mkdir()
  with pytest.raises(download.DownloadError, match=r"expected one \*options\*.json"):
    pretrained.resolve(str(tmp_path / "empty"))
  with pytest.raises(download.DownloadError, match="URL of an options.json"):
    pretrained.resolve("http://127.0.0.1:1/model.bin")
  with pytest.raises(download.DownloadError, match=r"model\.tar\.gz: cannot download"):  # an archive: fetched
    pretrained.resolve("http://127.0.0.1:1/model.tar.gz")


def test_evaluate_model_flag(tmp_path, cache, monkeypatch, parsed_flags):
  import evaluate  # pylint: disable=g-import-not-at-top
  mirror(tmp_path / "www")
  with serve_models(tmp_path / "www") as (_, base):
    monkeypatch.setenv("ELMO_JAX_MODELS_URL", base)
    parsed_flags("--task=pos", "--model=small", f"--output_dir={tmp_path / 'out'}")
    _, cfg = evaluate.config_from_flags()
  m = pretrained.MODELS["small"]
  found = cfg.perplexity.model  # resolved once, by `resolve.resolve_model`
  assert found.options_file == download.cache_file(f"{base}/{m.key}/elmo_{m.key}_options.json")
  assert files.sha256_file(found.weight_file) == files.sha256_file(FIXTURE_WEIGHTS)
  parsed_flags("--task=pos", "--model=small", f"--options_file={FIXTURE_OPTIONS}", f"--weight_file={FIXTURE_WEIGHTS}",
               f"--output_dir={tmp_path / 'out'}")
  with pytest.raises(Exception, match="give one of --model"):
    evaluate.config_from_flags()


def test_init_from_released_name(tmp_path, cache, monkeypatch):
  from elmo_jax.formats import options as options_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.formats import weights as weights_lib  # pylint: disable=g-import-not-at-top
  from elmo_jax.training import init_from  # pylint: disable=g-import-not-at-top
  mirror(tmp_path / "www")
  options = options_lib.load(FIXTURE_OPTIONS)
  with serve_models(tmp_path / "www") as (_, base):
    monkeypatch.setenv("ELMO_JAX_MODELS_URL", base)
    params, softmax, description = init_from.load("small", options, "no-vocab")
  want = weights_lib.load_hdf5(FIXTURE_WEIGHTS, options)["params"]
  np.testing.assert_array_equal(params["lstm"]["forward_layer_0"]["W_0"], want["lstm"]["forward_layer_0"]["W_0"])
  assert softmax is None and "ELMo weights" in description and str(cache) in description
  other = options_lib.load(FIXTURE_OPTIONS)
  other["lstm"]["dim"] = 8
  with pytest.raises(init_from.InitFromError, match="model shape differs"):
    init_from.load("small", other, "no-vocab")  # cached now: offline
