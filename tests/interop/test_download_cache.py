"""The download cache never trusts bad bytes: a short or cut download is not cached, a cached file that fails
to load or lost its manifest record is fetched again (or refused offline), against a local http.server."""
from __future__ import annotations

import http.server
import json
import os
import shutil

import h5py
import numpy as np
import pytest

import http_util
from elmo_jax.embedding.embedder import Embedder, enable_compilation_cache
from elmo_jax.formats import checks
from elmo_jax.runtime import files
from elmo_jax.sources import download
from elmo_jax.sources import pretrained

from tiny import tiny_options


class _Handler(http.server.SimpleHTTPRequestHandler):
  """Serves a folder (HTTP/1.0 with Content-Length); `server.modes[path]` makes that path misbehave:
  'half': HTTP/1.0 without Content-Length, half the bytes, then close (looks complete to the client);
  'chunked-cut': Transfer-Encoding: chunked, half the bytes in chunks, then close without the last chunk;
  'html': a 200 with an HTML error page instead of the file;
  'rate-limited': a 200 with the JSON object {"error": "rate limited"} instead of the file;
  'loop': a 302 back to the same path (a redirect loop)."""

  def log_message(self, *args):  # keep test output clean
    pass

  def do_GET(self):  # noqa: N802
    self.server.requests.append(self.path)
    mode = self.server.modes.get(self.path)
    if mode is None:
      super().do_GET()
      return
    if mode == "loop":
      self.send_response(302)
      self.send_header("Location", self.path)
      self.send_header("Content-Length", "0")
      self.end_headers()
      self.close_connection = True
      return
    body = open(os.path.join(self.directory, self.path.lstrip("/")), "rb").read()
    if mode == "half":
      self.send_response(200)
      self.send_header("Content-Type", "application/octet-stream")
      self.end_headers()
      self.wfile.write(body[:len(body) // 2])
    elif mode == "chunked-cut":
      self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n")
      for i in range(0, len(body) // 2, 1024):
        part = body[i:min(i + 1024, len(body) // 2)]
        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
    elif mode in ("html", "rate-limited"):
      page = (b"<html><body>503 Service Unavailable</body></html>" if mode == "html" else
              b'{"error":"rate limited"}')
      self.send_response(200)
      self.send_header("Content-Type", "text/html")
      self.send_header("Content-Length", str(len(page)))
      self.end_headers()
      self.wfile.write(page)
    self.wfile.flush()
    self.close_connection = True


def serve(directory):
  return http_util.serve(_Handler, directory, modes={})


@pytest.fixture
def www(tmp_path):
  """A folder with a small weights-like HDF5 file (w.hdf5) and an options-like JSON file (o.json)."""
  root = tmp_path / "www"
  root.mkdir()
  with h5py.File(root / "w.hdf5", "w") as f:
    f.create_group("CNN").create_dataset("W", data=np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    f.create_dataset("b", data=np.ones(100, np.float32))
  (root / "o.json").write_text(json.dumps({"lstm": {"dim": 8}, "char_cnn": {"n_characters": 262}}))
  return root


cache = http_util.cache


def manifest(cache):
  return json.loads((cache / "manifest.json").read_text())


def same_bytes(a, b):
  return open(a, "rb").read() == open(b, "rb").read()


def test_check_kind(www, tmp_path):
  assert checks.check_kind(www / "w.hdf5") is None and checks.check_kind(www / "o.json") is None
  half = tmp_path / "half.hdf5"
  half.write_bytes((www / "w.hdf5").read_bytes()[:10_000])
  assert "not a readable HDF5 file (truncated?" in checks.check_kind(half)
  (tmp_path / "page.h5").write_text("<html>oops</html>")
  assert checks.check_kind(tmp_path / "page.h5") == "not an HDF5 file (it is an HTML page)"
  (tmp_path / "list.json").write_text("[1, 2]")
  assert checks.check_kind(tmp_path / "list.json") == "not a JSON object (it holds a JSON list)"
  (tmp_path / "cut.json").write_text('{"lstm": {"di')
  assert "not a readable JSON file (truncated?" in checks.check_kind(tmp_path / "cut.json")
  assert checks.check_kind(half, name="x.bin") is None  # other names: no kind check


def test_half_file_without_content_length_is_not_cached(www, cache):
  with serve(www) as (server, base):
    url = f"{base}/w.hdf5"
    server.modes["/w.hdf5"] = "half"
    with pytest.raises(download.DownloadError) as e:
      download.cached_path(url)
    message = str(e.value)
    assert "\n" not in message and url in message and "not a readable HDF5 file (truncated?" in message
    assert "no Content-Length" in message
    assert sorted(os.listdir(cache)) == ["manifest.json.lock"]  # no file, no .part, no recorded hash
    del server.modes["/w.hdf5"]  # the server is fixed: the next run downloads it again
    path = download.cached_path(url)
    assert server.requests == ["/w.hdf5", "/w.hdf5"]
  assert same_bytes(path, www / "w.hdf5")
  assert manifest(cache)[url]["sha256"] == files.sha256_file(www / "w.hdf5")


def test_chunked_download_cut_is_one_line(www, cache):
  with serve(www) as (server, base):
    server.modes["/w.hdf5"] = "chunked-cut"
    with pytest.raises(download.DownloadError, match=r"interrupted after \d+ bytes .*; run again to retry$") as e:
      download.cached_path(f"{base}/w.hdf5")
  assert "\n" not in str(e.value) and e.value.__cause__ is None and e.value.__suppress_context__
  assert sorted(os.listdir(cache)) == ["manifest.json.lock"]


def test_garbled_manifest_and_changed_bytes_are_not_adopted(www, cache, capsys):
  with serve(www) as (server, base):
    url, other = f"{base}/w.hdf5", f"{base}/o.json"
    path, options = download.cached_path(url), download.cached_path(other)
    with h5py.File(path, "r") as f:
      offset = f["CNN/W"].id.get_offset()
    with open(path, "r+b") as f:  # four changed bytes in the weights: still a readable HDF5 file
      f.seek(offset + 400)
      f.write(b"\x7f\x7f\x7f\x7f")
    assert checks.check_kind(path) is None and not same_bytes(path, www / "w.hdf5")
    (cache / "manifest.json").write_text('{"http://x": {"sha256": "ab')  # garbled
    capsys.readouterr()
    assert download.cached_path(url) == path
    assert server.requests == ["/w.hdf5", "/o.json", "/w.hdf5"]  # not adopted: fetched again
    assert same_bytes(path, www / "w.hdf5")
    err = capsys.readouterr().err
    assert "warning:" in err and "manifest.json" in err and "no longer trusted" in err
    rebuilt = manifest(cache)
    assert rebuilt[url]["sha256"] == files.sha256_file(www / "w.hdf5") and rebuilt[url]["source"] == "first download"
    assert list(rebuilt["#untrusted"]) == [os.path.basename(options)]  # the other file: fetched on its next use
    names = os.listdir(cache)
    assert len([n for n in names if n.startswith("manifest.json.corrupt-")]) == 1
    aside = [n for n in names if n.startswith(os.path.basename(path) + ".corrupt-")]
    assert len(aside) == 1 and not same_bytes(cache / aside[0], www / "w.hdf5")  # kept to inspect
    assert download.cached_path(other) == options and server.requests[-1] == "/o.json"
    assert "#untrusted" not in manifest(cache)
  assert download.cached_path(url) == path and download.cached_path(other) == options  # trusted again, offline


def test_intact_cache_is_used_offline_but_an_untrusted_copy_is_refused(www, cache, capsys):
  with serve(www) as (server, base):
    url, other = f"{base}/w.hdf5", f"{base}/o.json"
    path, options = download.cached_path(url), download.cached_path(other)
  # The server is gone: an intact manifest and intact files serve (the existing behaviour), silently.
  capsys.readouterr()
  assert download.cached_path(url) == path and download.cached_path(other) == options
  assert capsys.readouterr().err == ""
  (cache / "manifest.json").write_text("not json")
  with pytest.raises(download.DownloadError) as e:
    download.cached_path(url, timeout=5)
  message = str(e.value)
  assert "\n" not in message and "delete it" in message
  assert message.startswith(f"{path}: cached copy of {url} not trusted")
  assert same_bytes(path, www / "w.hdf5")  # left in place for the user to delete or verify
  with pytest.raises(download.DownloadError, match="not trusted"):  # refused again: no silent adoption
    download.cached_path(url, timeout=5)
  # A copy the user fetched and put there by hand (a new file) is checked by kind and adopted.
  os.remove(path)
  shutil.copy(www / "w.hdf5", path)
  assert download.cached_path(url) == path
  assert manifest(cache)[url]["source"] == "found in cache"
  # A file placed by hand with an intact manifest must still be of the right kind.
  junk = download.cache_file(f"{base}/junk.hdf5")
  with open(junk, "w") as f:
    f.write("<html>not found</html>")
  with pytest.raises(download.DownloadError, match="cannot download"):
    download.cached_path(f"{base}/junk.hdf5", timeout=5)
  assert not os.path.exists(junk) and "not an HDF5 file (it is an HTML page)" in capsys.readouterr().err


def test_recorded_unreadable_file_is_fetched_again(www, cache):
  """A cache written before downloads were validated: a half file whose hash was recorded as trusted."""
  with serve(www) as (server, base):
    url = f"{base}/w.hdf5"
    path = download.cache_file(url)
    os.makedirs(cache)
    with open(path, "wb") as f:
      f.write((www / "w.hdf5").read_bytes()[:10_000])
    entry = {"file": os.path.basename(path), "bytes": 10_000, "sha256": files.sha256_file(path),
             "source": "first download"}
    files.write_json(cache / "manifest.json", {url: entry})
    assert download.cached_path(url) == path and server.requests == ["/w.hdf5"]
  assert same_bytes(path, www / "w.hdf5")
  assert manifest(cache)[url]["sha256"] == files.sha256_file(www / "w.hdf5")


def test_wrong_kind_and_published_mismatch_are_refused(www, cache):
  with serve(www) as (server, base):
    url = f"{base}/o.json"
    server.modes["/o.json"] = "html"
    with pytest.raises(download.DownloadError, match=r"not a JSON file \(it is an HTML page\); not cached"):
      download.cached_path(url)
    del server.modes["/o.json"]
    with pytest.raises(download.DownloadError, match="published sha256"):
      download.cached_path(url, sha256="0" * 64)
    assert sorted(os.listdir(cache)) == ["manifest.json.lock"]
    good = files.sha256_file(www / "o.json")
    path = download.cached_path(url, sha256=good)
    assert manifest(cache)[url]["source"] == "published"
    with pytest.raises(download.DownloadError, match="published sha256"):  # cached, but not the published file
      download.cached_path(url, sha256="1" * 64)
  assert not os.path.exists(path)  # moved aside; the download that replaced it was refused


@pytest.fixture
def model_www(www):
  """`www/m/`: a valid options.json and a weights.hdf5 (a readable HDF5 file), as a model folder URL serves
  them; `www/m/weights`: the same HDF5 file under a name without an extension."""
  (www / "m").mkdir()
  (www / "m" / "options.json").write_text(json.dumps(tiny_options()))
  shutil.copy(www / "w.hdf5", www / "m" / "weights.hdf5")
  shutil.copy(www / "w.hdf5", www / "m" / "weights")
  return www


def test_an_options_error_reply_is_not_cached(model_www, cache):
  """D04: a 200 `{"error": "rate limited"}` for options.json passed the JSON-object check and was cached and
  trusted, so every later run failed with "missing key 'lstm'" after the server was fixed."""
  with serve(model_www) as (server, base):
    server.modes["/m/options.json"] = "rate-limited"
    with pytest.raises(download.DownloadError) as e:
      pretrained.resolve(f"{base}/m/")
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{base}/m/options.json: ")
    assert "not an ELMo options.json (missing key 'lstm'" in message and "rate limited" in message
    assert "not cached" in message
    assert sorted(os.listdir(cache)) == ["manifest.json.lock"]
    del server.modes["/m/options.json"]  # the server is fixed: the next run downloads it again
    options_file, weight_file = pretrained.resolve(f"{base}/m/")
    assert server.requests.count("/m/options.json") == 2
  assert json.loads(open(options_file).read()) == tiny_options() and same_bytes(weight_file, model_www / "w.hdf5")


def test_a_cached_options_error_reply_is_fetched_again_or_named_offline(model_www, cache, capsys):
  """D04: a cache written before the fix holds the error reply under a recorded hash: moved aside and fetched
  again; offline, one line naming the cache file and where it went."""
  with serve(model_www) as (server, base):
    url = f"{base}/m/options.json"
    path = download.cache_file(url)
    os.makedirs(cache)
    with open(path, "w") as f:
      f.write('{"error":"rate limited"}')
    entry = {"file": os.path.basename(path), "bytes": os.path.getsize(path), "sha256": files.sha256_file(path),
             "source": "first download"}
    files.write_json(cache / "manifest.json", {url: entry})
    assert download.cached_path(url) == path and server.requests == []  # no kind given: the old trust
    capsys.readouterr()
    options_file, _ = pretrained.resolve(f"{base}/m/")
    assert options_file == path and server.requests[0] == "/m/options.json"
    assert json.loads(open(path).read()) == tiny_options()
    err = capsys.readouterr().err
    assert "warning:" in err and "not an ELMo options.json (missing key 'lstm'" in err
  # Offline: the same bad copy again (as a run before the fix left it) is refused in one line.
  os.remove(path)
  with open(path, "w") as f:
    f.write('{"error":"rate limited"}')
  files.write_json(cache / "manifest.json", {url: {**entry, "sha256": files.sha256_file(path)}})
  with pytest.raises(download.DownloadError) as e:
    download.cached_path(url, kind="options", timeout=5)
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"{path}: cached copy of {url} failed its check")
  assert "(delete it)" in message and "cannot download" in message
  aside = [n for n in os.listdir(cache) if n.startswith(os.path.basename(path) + ".corrupt-")]
  assert len(aside) == 2 and not os.path.exists(path)
  assert os.path.basename(message.split("moved to ")[1].split(" ")[0]) in aside


def test_an_html_page_for_a_weights_url_without_extension_is_refused(model_www, cache):
  """D05-D07: a weights URL with no file extension got no kind check, so an HTML page was cached and
  trusted; the callers now say it must be HDF5."""
  with serve(model_www) as (server, base):
    url = f"{base}/m/weights"
    server.modes["/m/weights"] = "html"
    assert checks.check_kind(model_www / "m" / "options.json", name="x", kind="hdf5") == \
        "not an HDF5 file (it is a JSON file)"
    with pytest.raises(download.DownloadError, match=r"not an HDF5 file \(it is an HTML page\); not cached") as e:
      Embedder.from_files(f"{base}/m/options.json", url)
    assert "\n" not in str(e.value) and str(e.value).startswith(url)
    assert not os.path.exists(download.cache_file(url))
    # A page cached by an older run (recorded hash) is moved aside and fetched again from the fixed server.
    download.cached_path(url)  # no kind: trusted as before
    del server.modes["/m/weights"]
    assert checks.check_kind(download.cache_file(url), kind="hdf5") is not None
    path = download.cached_path(url, kind="hdf5")
    assert same_bytes(path, model_www / "w.hdf5") and server.requests.count("/m/weights") == 3
    # validate=: the caller's own check, on the download and on every use
    calls = []
    def too_small(p):
      calls.append(p)
      return "smaller than 1 MB" if os.path.getsize(p) < 1 << 20 else None
    with pytest.raises(download.DownloadError, match="smaller than 1 MB"):
      download.cached_path(url, kind="hdf5", validate=too_small, timeout=5)
    assert len(calls) == 2  # the cached copy, then its fresh download


def test_a_redirect_loop_is_one_line(www, cache):
  """D02: urllib's redirect-loop error spans 3 lines."""
  with serve(www) as (server, base):
    server.modes["/w.hdf5"] = "loop"
    with pytest.raises(download.DownloadError) as e:
      download.cached_path(f"{base}/w.hdf5", timeout=5)
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"{base}/w.hdf5: too many redirects, or a redirect loop")
  assert "HTTP 302" in message and "check the URL" in message


def test_a_cache_path_that_is_a_file_is_one_line(www, tmp_path, monkeypatch):
  """D12: ELMO_JAX_CACHE pointing at a regular file said "[Errno 17] File exists: ..."."""
  blocker = tmp_path / "cachefile"
  blocker.write_text("not a folder")
  monkeypatch.setenv("ELMO_JAX_CACHE", str(blocker))
  with serve(www) as (server, base):
    with pytest.raises(download.DownloadError) as e:
      download.cached_path(f"{base}/w.hdf5")
    assert str(e.value) == f"ELMO_JAX_CACHE={blocker} is a file, not a directory" and server.requests == []
    monkeypatch.setenv("ELMO_JAX_CACHE", str(blocker / "sub"))
    with pytest.raises(download.DownloadError) as e:
      download.cached_path(f"{base}/w.hdf5")
    assert str(e.value) == f"ELMO_JAX_CACHE={blocker / 'sub'}: {blocker} is a file, not a directory"
  # The compilation cache of the loading path (Embedder): the same line, not [Errno 17]/[Errno 20].
  monkeypatch.setenv("ELMO_JAX_CACHE", str(blocker))
  import jax  # pylint: disable=g-import-not-at-top
  before = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", None)
  try:
    with pytest.raises(download.DownloadError, match=f"^ELMO_JAX_CACHE={blocker} is a file, not a directory$"):
      enable_compilation_cache()
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
  with pytest.raises(download.DownloadError, match=f"^the compilation cache folder {blocker} is a file"):
    enable_compilation_cache(blocker)
  assert jax.config.jax_compilation_cache_dir == before
