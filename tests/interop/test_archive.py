"""Model archives by URL or path (sources/archive.py): downloaded and unpacked once into the cache, reused
offline, read as the folder they hold; members that would leave the cache folder refused, against a local
http.server (nothing leaves the machine)."""
from __future__ import annotations

import io
import os
import stat
import tarfile
import zipfile

import numpy as np
import pytest

import http_util
from elmo_jax.embedding.embedder import Embedder
from elmo_jax.runtime import files
from elmo_jax.runtime.cache import ARCHIVES
from elmo_jax.sources import archive
from elmo_jax.sources import download
from elmo_jax.sources import pretrained
from elmo_jax.sources import resolve as resolve_lib
from http_util import serve_models
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS

cache = http_util.cache
FIXTURE = (files.sha256_file(FIXTURE_OPTIONS), files.sha256_file(FIXTURE_WEIGHTS))


def _zip(path, members: dict[str, bytes | str]):
  """A zip of `members` (name -> bytes, or the path of a file to copy)."""
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in members.items():
      z.writestr(name, data) if isinstance(data, bytes) else z.write(data, name)
  return path


def _tar(path, members: dict[str, bytes | str], mode: str = "w:bz2"):
  with tarfile.open(path, mode) as t:
    for name, data in members.items():
      t.add(data, name) if isinstance(data, str) else t.addfile(_info(name, len(data)), io.BytesIO(data))
  return path


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
  info = tarfile.TarInfo(name)
  info.size, info.type, info.linkname = size, kind, link
  return info


def _sha(model: pretrained.ResolvedModel) -> tuple[str, str]:
  return tuple(files.sha256_file(p) for p in model.files)


def _archives(cache_path) -> list[str]:
  root = cache_path / ARCHIVES
  return sorted(os.listdir(root)) if root.exists() else []


def test_nlpl_zip_by_url_unpacked_once_then_offline(tmp_path, cache):
  www = tmp_path / "www"
  www.mkdir()
  # NLPL's repository layout (vectors.nlpl.eu/repository/20/NNN.zip): options.json and model.hdf5 at the top
  _zip(www / "199.zip", {"meta.json": b'{"id": 199}', "README": b"ELMo, Norwegian\n",
                         "options.json": FIXTURE_OPTIONS, "model.hdf5": FIXTURE_WEIGHTS})
  with serve_models(www) as (server, base):
    url = f"{base}/199.zip"
    model = pretrained.resolve_model(url)
    folder = os.path.dirname(model.options_file)
    assert os.path.basename(model.weight_file) == "model.hdf5" and _sha(model) == FIXTURE
    assert model.path == url and os.path.dirname(folder) == str(cache / ARCHIVES)
    embedder = Embedder.from_pretrained(url)
    assert server.requests == ["/199.zip"]  # the second use: cached archive, unpacked folder reused
  # A killed unpack's leftover is removed by the next one that unpacks; the server is gone: offline reuse.
  key = os.path.basename(folder)
  (cache / ARCHIVES / f".{key}.tmp-killed").mkdir()
  assert pretrained.resolve_model(url).files == model.files
  os.rename(folder, folder + ".moved")  # the folder gone: unpacked again from the cached archive, offline
  assert pretrained.resolve_model(url).files == model.files
  assert sorted(n for n in _archives(cache) if not n.endswith(".lock")) == [key, key + ".moved"]
  sentences = [["The", "bank", "."], ["Hi"]]
  want = Embedder.from_files(FIXTURE_OPTIONS, FIXTURE_WEIGHTS).embed_sentences(sentences)
  for got, ref in zip(embedder.embed_sentences(sentences), want):
    np.testing.assert_array_equal(got, ref)


def test_tar_nested_one_level_and_weights_hdf5(tmp_path, cache):
  for name, mode in (("m.tar.gz", "w:gz"), ("m.tar.bz2", "w:bz2")):
    path = _tar(tmp_path / name, {"elmo_no/options.json": FIXTURE_OPTIONS, "elmo_no/weights.hdf5": FIXTURE_WEIGHTS,
                                  "__MACOSX/._x": b"resource fork"}, mode)
    model = pretrained.resolve_model(str(path))  # a local archive path, as a URL's download would be
    assert _sha(model) == FIXTURE and os.path.basename(os.path.dirname(model.options_file)) == "elmo_no"
    assert pretrained.resolve_model("file://" + str(path)).files == model.files
  assert len([n for n in _archives(cache) if not n.startswith(".")]) == 2  # one folder per archive content


def test_efml_folder_is_handed_to_folder_resolution(tmp_path, cache, monkeypatch):
  """An ELMoForManyLangs zip: unpacked, stepped into, and the folder given to `resolve_model` as any local
  folder, which decides the format (its reader lives there, not in archive.py)."""
  efml = {f"zhs.model/{n}": n.encode() for n in ("config.json", "char.dic", "word.dic", "encoder.pkl",
                                                   "token_embedder.pkl")}
  path = str(_zip(tmp_path / "zhs.model.zip", efml))
  resolve, seen = resolve_lib.resolve_model, []

  def folder_dispatch(spec, **kwargs):
    seen.append((spec, kwargs))
    return resolve_lib.ResolvedModel(path=spec)
  monkeypatch.setattr(resolve_lib, "resolve_model", folder_dispatch)
  found = resolve(path, use="bilm")
  (folder, kwargs), = seen
  assert kwargs == {"use": "bilm"} and found.path == path
  assert os.path.basename(folder) == "zhs.model" and os.path.dirname(os.path.dirname(folder)) == str(cache / ARCHIVES)
  assert sorted(os.listdir(folder)) == sorted(n.split("/")[1] for n in efml)
  monkeypatch.setattr(resolve_lib, "resolve_model", resolve)
  # The real folder resolution knows the layout (formats/efml.py): its config and encoder, the folder as path.
  found = resolve(path)
  assert (found.options_file, found.weight_file) == (os.path.join(folder, "config.json"),
                                                     os.path.join(folder, "encoder.pkl"))
  other = str(_zip(tmp_path / "notes.zip", {"notes/readme.txt": b"not a model"}))
  with pytest.raises(archive.ArchiveError, match=r"notes\.zip: unpacked into .*notes, which holds no "
                     r"model it can read: expected one \*options\*\.json") as e:
    resolve(other)
  assert "\n" not in str(e.value)


def _symlink_zip(path):
  info = zipfile.ZipInfo("model/weights.hdf5")
  info.create_system, info.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("model/options.json", b"{}")
    z.writestr(info, b"/etc/passwd")
  return path


def _tar_special(path, info):
  with tarfile.open(path, "w:gz") as t:
    t.addfile(_info("model/options.json", 2), io.BytesIO(b"{}"))
    t.addfile(info)
  return path


@pytest.mark.parametrize("make,member,why", [
    (lambda p: _zip(p / "a.zip", {"options.json": b"{}", "../../evil": b"x"}), "../../evil", "climbs out"),
    (lambda p: _zip(p / "a.zip", {"m/..\\..\\evil": b"x"}), "m/..\\\\..\\\\evil", "climbs out"),
    (lambda p: _zip(p / "a.zip", {"/tmp/evil": b"x"}), "/tmp/evil", "absolute path"),
    (lambda p: _symlink_zip(p / "a.zip"), "model/weights.hdf5", "a symbolic link"),
    (lambda p: _tar_special(p / "a.tar.gz", _info("model/w", kind=tarfile.SYMTYPE, link="/etc/passwd")), "model/w",
     "a symbolic link"),
    (lambda p: _tar_special(p / "a.tar.gz", _info("model/w", kind=tarfile.LNKTYPE, link="/etc/passwd")), "model/w",
     "a hard link"),
    (lambda p: _tar_special(p / "a.tar.gz", _info("model/dev", kind=tarfile.CHRTYPE)), "model/dev", "a device"),
    (lambda p: _tar(p / "a.tar.gz", {"../evil": b"x"}, "w:gz"), "../evil", "climbs out"),
])
def test_escaping_member_refused_and_nothing_written(tmp_path, cache, make, member, why):
  (tmp_path / "deep" / "er").mkdir(parents=True)
  path = str(make(tmp_path / "deep" / "er"))
  with pytest.raises(archive.ArchiveError) as e:
    pretrained.resolve_model(path)
  message = str(e.value)
  assert message.startswith(f"{path}: member '{member}' ") if "\\" not in member else member in message
  assert why in message and "refusing to unpack" in message and "\n" not in message
  assert [n for n in _archives(cache) if not n.endswith(".lock")] == []  # no folder, no temporary left
  assert not (tmp_path / "deep" / "evil").exists() and not (tmp_path / "evil").exists()


def test_not_an_archive_is_not_cached(tmp_path, cache):
  (tmp_path / "www").mkdir()
  (tmp_path / "www" / "m.zip").write_text("<html>404 Not Found</html>")
  with serve_models(tmp_path / "www") as (_, base):
    with pytest.raises(download.DownloadError, match=r"m\.zip: the downloaded 26 bytes are not a zip or tar "
                       r"archive \(an HTML page\); not cached"):
      pretrained.resolve_model(f"{base}/m.zip")
  assert not [n for n in os.listdir(cache) if n.endswith("m.zip")] and _archives(cache) == []
  with pytest.raises(archive.ArchiveError, match=r"m\.zip: not a zip or tar archive \(an HTML page\)"):
    pretrained.resolve_model(str(tmp_path / "www" / "m.zip"))


def test_concurrent_unpacks_write_once(tmp_path, cache, monkeypatch):
  """Two users of one archive at once (threads here; `flock` locks between open files as between processes):
  one unpacks, the other waits for the lock and reuses the folder."""
  import threading  # pylint: disable=g-import-not-at-top
  path = str(_zip(tmp_path / "m.zip", {"options.json": FIXTURE_OPTIONS, "model.hdf5": FIXTURE_WEIGHTS}))
  unpack, calls, barrier = archive._unpack, [], threading.Barrier(2)

  def counting_unpack(*args):
    calls.append(args)
    unpack(*args)
  monkeypatch.setattr(archive, "_unpack", counting_unpack)
  got = []

  def use():
    barrier.wait()
    got.append(archive.unpacked(path))
  threads = [threading.Thread(target=use) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(calls) == 1 and len(got) == 2 and got[0] == got[1]
  assert sorted(os.listdir(got[0])) == ["model.hdf5", "options.json"]


def test_cut_archive_is_one_line_and_leaves_nothing(tmp_path, cache):
  whole = _tar(tmp_path / "w.tar.gz", {"m/options.json": FIXTURE_OPTIONS, "m/weights.hdf5": FIXTURE_WEIGHTS}, "w:gz")
  cut = tmp_path / "cut.tar.gz"
  cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
  with pytest.raises(archive.ArchiveError, match=r"cut\.tar\.gz: cannot unpack it \(") as e:
    pretrained.resolve_model(str(cut))
  assert "\n" not in str(e.value) and [n for n in _archives(cache) if not n.endswith(".lock")] == []
