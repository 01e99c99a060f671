"""runtime/files.py and outside_names.py: a name from outside is a name (`name_parts` / `inside`, the one check
every caller uses), and an atomic folder write takes no neighbour's name."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elmo_jax.runtime import files
from elmo_jax.runtime import outside_names

BAD = {
    "..": "not a file name", "a/../../b": "climbs out", "/etc/passwd": "absolute path", "\\\\server\\x": "absolute path",
    "C:\\Windows\\x": "drive letter", "c:x": "drive letter", "%2e%2e/x": "climbs out", "%252e%252e/x": "climbs out",
    "a\\..\\..\\b": "climbs out", "a\\b": "backslash", "%2Fetc%2Fpasswd": "absolute path", "a/\x00b": "control",
    "": "not a file name", ".": "not a file name", "/": "not a file name",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_name_that_could_leave_its_folder_is_refused_in_one_line(tmp_path, name):
  with pytest.raises(outside_names.OutsideNameError, match=BAD[name]) as e:
    outside_names.inside(tmp_path, name, "a test name")
  assert "\n" not in str(e.value) and str(e.value).startswith("a test name ")


@pytest.mark.parametrize("name,parts", [("a/b.txt", ["a", "b.txt"]), ("./a//b/", ["a", "b"]), ("100%.txt", ["100%.txt"]),
                                        ("a..b", ["a..b"]), ("é/中.json", ["é", "中.json"])])
def test_plain_names_map_under_the_root(tmp_path, name, parts):
  assert outside_names.inside(tmp_path, name) == os.path.join(tmp_path, *parts)


def test_a_link_under_the_root_does_not_lead_a_name_out(tmp_path):
  (tmp_path / "root").mkdir()
  os.symlink("/etc", tmp_path / "root" / "link")
  with pytest.raises(outside_names.OutsideNameError, match="leads out of .* through a link"):
    outside_names.inside(tmp_path / "root", "link/passwd")


def test_atomic_dir_leaves_a_users_tmp_and_old_folders_alone(tmp_path):
  """`convert --to=DIR/model` deleted DIR/model.old/ and DIR/model.tmp/: the writer's temp names are its own."""
  for name in ("model.old", "model.tmp"):
    (tmp_path / name).mkdir()
    (tmp_path / name / "mine.txt").write_text("the user's")
  for content in ("first", "second"):  # a fresh folder, then one replaced
    with files.atomic_dir(tmp_path / "model") as tmp:
      assert files.WRITER_MARK in os.path.basename(tmp) and os.path.dirname(tmp) == str(tmp_path)
      with open(os.path.join(tmp, "x.txt"), "w") as f:
        f.write(content)
  assert (tmp_path / "model" / "x.txt").read_text() == "second"
  assert sorted(os.listdir(tmp_path)) == ["model", "model.old", "model.tmp"]
  assert all((tmp_path / n / "mine.txt").read_text() == "the user's" for n in ("model.old", "model.tmp"))


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o027, 0o077])
def test_atomic_dir_gives_the_folder_mkdirs_mode_not_0700(tmp_path, umask):
  """Every run's export/ and every convert --to were 0700: others could not read a shared model."""
  old = os.umask(umask)
  try:
    os.mkdir(tmp_path / "plain")
    with files.atomic_dir(tmp_path / "model") as tmp:
      (open(os.path.join(tmp, "x.txt"), "w")).close()
  finally:
    os.umask(old)
  mode = os.stat(tmp_path / "model").st_mode & 0o777
  assert mode == 0o777 & ~umask == os.stat(tmp_path / "plain").st_mode & 0o777, oct(mode)


def test_atomic_dir_writes_through_a_symlinked_target_and_keeps_the_link(tmp_path):
  """A symlinked --to was renamed away and left as a hidden link beside the new folder."""
  (tmp_path / "disk").mkdir()
  (tmp_path / "disk" / "model").mkdir()
  (tmp_path / "disk" / "model" / "stale.txt").write_text("old")
  os.symlink(tmp_path / "disk" / "model", tmp_path / "link")
  os.symlink(tmp_path / "disk" / "new", tmp_path / "dangling")  # a link to a folder not made yet
  for target in ("link", "dangling"):
    with files.atomic_dir(tmp_path / target) as tmp:
      with open(os.path.join(tmp, "x.txt"), "w") as f:
        f.write(target)
    assert os.path.islink(tmp_path / target) and (tmp_path / target / "x.txt").read_text() == target
  assert sorted(os.listdir(tmp_path)) == ["dangling", "disk", "link"]  # no hidden leftover
  assert sorted(os.listdir(tmp_path / "disk")) == ["model", "new"]
  assert os.listdir(tmp_path / "disk" / "model") == ["x.txt"]


def test_atomic_dir_failure_keeps_the_old_folder_and_a_dead_writers_leftover_is_cleared(tmp_path):
  (tmp_path / "model").mkdir()
  (tmp_path / "model" / "x.txt").write_text("old")
  with pytest.raises(RuntimeError):
    with files.atomic_dir(tmp_path / "model"):
      raise RuntimeError("failed")
  assert sorted(os.listdir(tmp_path)) == ["model"] and (tmp_path / "model" / "x.txt").read_text() == "old"
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                        text=True, check=True).stdout.strip()
  import socket  # pylint: disable=g-import-not-at-top
  leftover = tmp_path / f".model.{files.WRITER_MARK}-{socket.gethostname()}.{dead}.abc"
  leftover.mkdir()
  with files.atomic_dir(tmp_path / "model"):
    pass
  assert sorted(os.listdir(tmp_path)) == ["model"]


def test_convert_checks_the_room_before_the_first_byte(tmp_path, monkeypatch):
  """A full disk during convert was an h5py segfault that left a temp folder: refused in one line first."""
  import collections  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from elmo_jax.sources import convert  # pylint: disable=g-import-not-at-top
  from elmo_jax.sources import loaded  # pylint: disable=g-import-not-at-top
  usage = collections.namedtuple("usage", "total used free")
  monkeypatch.setattr(files.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
  model = loaded.LoadedModel({"char_cnn": {}, "lstm": {}}, {"w": np.zeros([1 << 20], np.float32)}, "bilm-hdf5", ())
  with pytest.raises(files.UnsafeOutputError, match=r"--to=.*out: needs about 5\.\d MB free in .*, 1\.0 MB are "
                     r"free; make room or write elsewhere"):
    convert.write(model, str(tmp_path / "out"))
  assert os.listdir(tmp_path) == []
