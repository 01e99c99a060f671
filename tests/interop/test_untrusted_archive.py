"""An archive is verified whole before it is trusted and unpacks within bounds (sources/archive.py): a cut
download without a Content-Length is not cached, a corrupt stream or zip member is one line, a bomb is
refused before it is inflated (in a child under a memory limit), and an unpacked folder edited or lost
since is unpacked again."""
from __future__ import annotations

import http.server
import io
import os
import tarfile
import zipfile

import pytest

import http_util
import torch_files
from elmo_jax.runtime import files
from elmo_jax.sources import archive
from elmo_jax.sources import download
from elmo_jax.sources import pretrained
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS

cache = http_util.cache
MODEL = {"m/options.json": FIXTURE_OPTIONS, "m/weights.hdf5": FIXTURE_WEIGHTS}


def _tar(path, members, mode="w:gz"):
  with tarfile.open(path, mode) as t:
    for name, data in members.items():
      if isinstance(data, str):
        t.add(data, name)
      else:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
  return str(path)


def _zip(path, members, compression=zipfile.ZIP_DEFLATED):
  with zipfile.ZipFile(path, "w", compression) as z:
    for name, data in members.items():
      z.writestr(name, data if isinstance(data, bytes) else open(data, "rb").read())
  return str(path)


def _flip(path, at: int) -> str:
  data = bytearray(open(path, "rb").read())
  data[at] ^= 0x55
  open(path, "wb").write(bytes(data))
  return path


class _NoLength(http.server.SimpleHTTPRequestHandler):
  """Sends half the file and no Content-Length (HTTP/1.0: the body ends where the connection closes),
  while `server.cut` is set; the whole file after."""

  def log_message(self, *args):
    pass

  def do_GET(self):  # noqa: N802
    self.server.requests.append(self.path)
    data = open(os.path.join(self.directory, self.path.lstrip("/")), "rb").read()
    self.send_response(200)
    self.end_headers()
    self.wfile.write(data[:len(data) // 2] if self.server.cut else data)


def test_half_a_tar_gz_without_content_length_is_not_cached(tmp_path, cache):
  www = tmp_path / "www"
  www.mkdir()
  _tar(www / "m.tar.gz", MODEL)
  with http_util.serve(_NoLength, www, cut=True) as (server, base):
    url = f"{base}/m.tar.gz"
    with pytest.raises(download.DownloadError) as e:
      pretrained.resolve_model(url)
    message = str(e.value)
    assert message.startswith(f"{url}: the downloaded ") and "not a whole archive (EOFError: " in message
    assert "the server sent no Content-Length" in message and "not cached, run again" in message
    assert "\n" not in message
    assert not [n for n in os.listdir(cache) if n.endswith("m.tar.gz")]
    server.cut = False  # the rerun gets the whole file and uses it
    model = pretrained.resolve_model(url)
    assert files.sha256_file(model.weight_file) == files.sha256_file(FIXTURE_WEIGHTS)


@pytest.mark.parametrize("name,make,says", [
    ("crc.tar.gz", lambda p: _flip(_tar(p, MODEL), os.path.getsize(p) - 6), "not a whole archive (BadGzipFile: CRC"),
    ("mid.tar.gz", lambda p: _flip(_tar(p, MODEL), os.path.getsize(p) // 2), "not a whole archive ("),
    ("mid.tar.xz", lambda p: _flip(_tar(p, MODEL, "w:xz"), os.path.getsize(p) // 2), "not a whole archive ("),
    ("cut.tar.bz2", lambda p: open(p, "wb").write(open(_tar(str(p) + ".w", MODEL, "w:bz2"), "rb").read()[:-40]),
     "not a whole archive ("),
    ("cut.tar", lambda p: open(p, "wb").write(open(_tar(str(p) + ".w", MODEL, "w"), "rb").read()[:30000]),
     "not a whole archive (ReadError: unexpected end of data"),
    ("bad.zip", lambda p: _flip(_zip(p, MODEL), 2000), "not a whole archive ("),
    ("enc.zip", lambda p: _header(_zip(p, {"m/options.json": b"{}"}, zipfile.ZIP_STORED), 6, 1),
     "an archive whose member 'm/options.json' is encrypted"),
    ("d64.zip", lambda p: _header(_zip(p, {"m/options.json": b"{}"}, zipfile.ZIP_STORED), 8, 9),
     "uses zip compression method 9 (deflate64), which Python's zipfile cannot read"),
])
def test_a_damaged_archive_or_codec_is_one_line_and_leaves_nothing(tmp_path, cache, name, make, says):
  path = tmp_path / name
  make(path)
  with pytest.raises(archive.ArchiveError) as e:
    pretrained.resolve_model(str(path))
  message = str(e.value)
  assert message.startswith(f"{path}: cannot unpack it (") and says in message and "\n" not in message, message
  root = cache / "archives"
  assert not root.exists() or [n for n in os.listdir(root) if not n.endswith(".lock")] == []


def _header(path: str, at: int, value: int) -> str:
  """Sets a 2-byte field of every member's local header at offset `at` (the central header's is 2 later):
  6 the flags (bit 0: encrypted), 8 the compression method."""
  data = bytearray(open(path, "rb").read())
  for sig, offset in ((b"PK\x03\x04", at), (b"PK\x01\x02", at + 2)):
    i = data.find(sig)
    while i >= 0:
      data[i + offset:i + offset + 2] = value.to_bytes(2, "little")
      i = data.find(sig, i + 4)
  open(path, "wb").write(bytes(data))
  return path


@pytest.mark.slow
def test_bombs_refused_before_inflating_within_memory_and_time(tmp_path):
  """A zip whose central directory says 96 MiB, a tar.gz that inflates to 96 MiB, a zip whose header says
  1 KiB over a member that inflates further: each refused in one line, in a child limited to 768 MiB."""
  zeros = bytes(96 << 20)
  cases = [("zip bomb", _zip(tmp_path / "b.zip", {"m/w.hdf5": zeros})),
           ("tar.gz bomb", _tar(tmp_path / "b.tar.gz", {"m/w.hdf5": zeros}))]
  lying = tmp_path / "lie.zip"
  _zip(lying, {"m/w.hdf5": zeros[:1 << 20]})
  data = bytearray(lying.read_bytes())  # the central directory's uncompressed size: 1 KiB
  central = data.find(b"PK\x01\x02")
  data[central + 24:central + 28] = (1024).to_bytes(4, "little")
  lying.write_bytes(bytes(data))
  cases.append(("lying zip", str(lying)))
  del zeros, data
  code = torch_files.REFUSALS + f"""
from elmo_jax.sources import archive
def check(path):
  problem = archive.verify(path)
  if problem is not None:
    raise archive.ArchiveError(path + ": " + problem)
refusals(check, {cases!r}, (archive.ArchiveError,))
"""
  results = torch_files.run_limited(code)
  assert [r["case"] for r in results] == [c for c, _ in cases]
  for r in results:
    assert r["error"] == "ArchiveError" and "\n" not in r["message"] and r["seconds"] < 5, r
  assert "would unpack to 100,663,296 bytes, more than 67,108,864" in results[0]["message"]
  assert "refused as a decompression bomb" in results[1]["message"]
  assert "not a whole archive (" in results[2]["message"]


def test_a_bomb_is_not_unpacked_and_the_ratio_is_a_bound(tmp_path, cache, monkeypatch):
  monkeypatch.setattr(archive, "MIN_ALLOWANCE", 1 << 16)
  path = _zip(tmp_path / "r.zip", {"m/options.json": FIXTURE_OPTIONS, "m/zeros": bytes(1 << 20)})
  size = os.path.getsize(path)
  with pytest.raises(archive.ArchiveError) as e:
    pretrained.resolve_model(path)
  total = (1 << 20) + os.path.getsize(FIXTURE_OPTIONS)
  assert f"would unpack to {total:,} bytes, more than {100 * size:,}" in str(e.value)
  monkeypatch.setattr(archive, "MAX_RATIO", 10_000)
  assert os.path.isdir(archive.unpacked(path))


def test_an_unpacked_folder_edited_or_lost_is_unpacked_again(tmp_path, cache):
  path = _tar(tmp_path / "m.tar.gz", MODEL)
  model = pretrained.resolve_model(path)
  want = files.sha256_file(model.weight_file)
  folder = archive.unpacked(path)
  for edit in (lambda: open(model.weight_file, "r+b").write(b"\x00"),           # edited in place
               lambda: os.remove(model.options_file),                             # a file lost
               lambda: open(os.path.join(folder, "m", "extra.json"), "w").write("{}"),  # a file added
               lambda: open(os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.lock"), "w")):
    edit()
    again = pretrained.resolve_model(path)
    assert again.files == model.files and files.sha256_file(again.weight_file) == want
    assert sorted(os.listdir(os.path.join(folder, "m"))) == ["options.json", "weights.hdf5"]
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(folder)  # the folder lost
  assert files.sha256_file(pretrained.resolve_model(path).weight_file) == want


@pytest.mark.parametrize("name,mode", [("many.zip", None), ("many.tar.gz", "w:gz"), ("many.tar", "w")])
def test_an_archive_of_too_many_members_is_refused_and_nothing_stays(tmp_path, cache, monkeypatch, name, mode):
  """300,000 tiny files within the byte allowance unpacked into the cache and stayed: the count is bounded
  (here MAX_MEMBERS=20, so the archives are small); at the bound the model still unpacks."""
  monkeypatch.setattr(archive, "MAX_MEMBERS", 20)
  tiny = {f"m/tiny/{i:03d}": b"x" for i in range(19)}
  for members, refused in (({**MODEL, **tiny}, True), ({**MODEL, **dict(list(tiny.items())[:18])}, False)):
    path = str(tmp_path / f"{len(members)}-{name}")
    _zip(path, members) if mode is None else _tar(path, members, mode)
    if not refused:
      assert pretrained.resolve_model(path).weight_file.endswith("weights.hdf5")
      continue
    with pytest.raises(archive.ArchiveError) as e:
      pretrained.resolve_model(path)
    count = "21" if mode is None else "more than 20"
    assert str(e.value) == (f"{path}: cannot unpack it (an archive of {count} members, more than the 20 a model's "
                            "may hold (archive.MAX_MEMBERS); refused before unpacking)"), str(e.value)
    assert [n for n in os.listdir(cache / "archives") if not n.endswith(".lock")] == []


def test_the_default_member_bound_refuses_ten_thousand_and_one_empty_files(tmp_path):
  path = _zip(tmp_path / "many.zip", {f"f{i}": b"" for i in range(archive.MAX_MEMBERS + 1)}, zipfile.ZIP_STORED)
  assert archive.verify(path) == (f"an archive of {archive.MAX_MEMBERS + 1:,} members, more than the "
                                  f"{archive.MAX_MEMBERS:,} a model's may hold (archive.MAX_MEMBERS); refused "
                                  "before unpacking")
