"""`hf://owner/name@revision` specs and `elmo-jax push` against a fake Hub on 127.0.0.1 (tests/hub_util.py):
first fetch, pinned and unpinned revisions, offline reuse, a file that differs from the Hub's sha256 refused and
not kept, push then pull the same bytes; any format a folder holds."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

import efml_util
import hub_util
from elmo_jax.cli import push as push_cli
from elmo_jax.sources import convert
from elmo_jax.sources import hub as hub_lib
from elmo_jax.sources import loaded
from elmo_jax.sources import pretrained
from hub_util import hub  # noqa: F401  pylint: disable=unused-import  (the fake Hub, a fixture)
from paths import FIXTURE_OPTIONS, FIXTURE_WEIGHTS, REPO_ROOT


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
  """bilm-tf's fixture as a safetensors model folder (with its card)."""
  out = str(tmp_path_factory.mktemp("st") / "elmo_tiny")
  pair = tmp_path_factory.mktemp("pair")
  shutil.copy(FIXTURE_OPTIONS, pair / "options.json")
  shutil.copy(FIXTURE_WEIGHTS, pair / "weights.hdf5")
  convert.convert(str(pair), out, "safetensors")
  return out


def _files(folder: str) -> dict[str, bytes]:
  return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))}


def _seed(server, repo_id: str, files: dict[str, bytes]) -> str:
  server.repos.setdefault(repo_id, hub_util.Repo())
  return server.repos[repo_id].commit(files)


def test_first_fetch_pinned_revision_and_offline_reuse(hub, folder, monkeypatch, capsys):
  first = _seed(hub, "me/elmo", _files(folder))
  hub.repos["me/elmo"].refs["v1"] = first
  found = pretrained.resolve_model("hf://me/elmo")
  assert "hf://me/elmo: unpinned; main is commit " + first in capsys.readouterr().err
  assert found.folder_dir is not None and found.path == "hf://me/elmo"
  assert _files(found.folder_dir) == _files(folder) and str(hub.cache) in found.folder_dir
  model = loaded.load_model(found)
  assert model.format == "safetensors"
  # a new commit on main: the unpinned spec follows it, the pinned ones (commit, tag) keep the first files
  second = _seed(hub, "me/elmo", {"README.md": b"# changed\n"})
  assert open(os.path.join(pretrained.resolve_model("hf://me/elmo").folder_dir, "README.md"), "rb").read() == (
      b"# changed\n")
  assert f"main is commit {second}" in capsys.readouterr().err
  for pin in (first, "v1"):
    got = pretrained.resolve_model(f"hf://me/elmo@{pin}")
    assert _files(got.folder_dir) == _files(folder), pin
  assert "unpinned" not in capsys.readouterr().err
  # offline: from the cache alone, not one request; what was never fetched is one line
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  hub.requests.clear()
  for spec in (f"hf://me/elmo@{first}", "hf://me/elmo@v1", "hf://me/elmo"):
    assert os.path.isfile(os.path.join(pretrained.resolve_model(spec).folder_dir, "model.safetensors")), spec
  assert hub.requests == []
  with pytest.raises(hub_lib.HubError, match=r"^hf://me/other \(offline: nothing cached for it\): ") as e:
    pretrained.resolve_model("hf://me/other")
  assert "\n" not in str(e.value)


def test_a_file_that_differs_from_the_hubs_sha256_is_refused_and_not_kept(hub, folder, monkeypatch):
  commit = _seed(hub, "me/elmo", _files(folder))
  hub.tamper.add("me/elmo/model.safetensors")
  with pytest.raises(hub_lib.HubError, match=r"model.safetensors: its sha256 [0-9a-f]{16}\.\.\. differs from the "
                                             r"Hub's [0-9a-f]{16}\.\.\.; the cached copy is deleted$"):
    pretrained.resolve_model(f"hf://me/elmo@{commit}")
  blobs = [p for p in hub.cache.rglob("blobs/*") if p.is_file()]
  assert all(p.read_bytes() != _files(folder)["model.safetensors"][:1] for p in blobs)
  assert not any(p.name == "model.safetensors" for p in hub.cache.rglob("snapshots/*/*"))
  hub.tamper.clear()  # the true bytes now: downloaded again, verified
  found = pretrained.resolve_model(f"hf://me/elmo@{commit}")
  assert _files(found.folder_dir) == _files(folder)
  # a cached copy changed on disk is refused offline too, against the hash it was stored under
  blob = os.path.realpath(os.path.join(found.folder_dir, "model.safetensors"))
  with open(blob, "r+b") as f:
    f.write(b"\0")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(hub_lib.HubError, match="differs from the Hub's"):
    pretrained.resolve_model(f"hf://me/elmo@{commit}")
  assert not os.path.exists(blob)


def test_push_then_pull_returns_the_same_bytes(hub, folder, tmp_path, capsys):
  hub_lib.parse("hf://me/pushed")
  pushed = hub_lib.push(folder, "hf://me/pushed", push_cli.check_folder(folder))
  assert pushed.startswith("hf://me/pushed@") and pushed.split("@")[1] == hub.repos["me/pushed"].refs["main"]
  assert _files(pretrained.resolve_model(pushed).folder_dir) == _files(folder)
  # a folder that is not a loadable safetensors model folder is refused before anything is sent
  bad = tmp_path / "bad"
  shutil.copytree(folder, bad)
  (bad / "model.safetensors").write_bytes(b"\0" * 4)
  requests = len(hub.requests)
  for path, words in ((str(bad), "shorter than a safetensors header"), (str(tmp_path), "not a safetensors model")):
    with pytest.raises(Exception, match=words) as e:
      push_cli.check_folder(path)
    assert "\n" not in str(e.value)
  assert len(hub.requests) == requests


def test_any_format_a_folder_holds_and_one_line_errors(hub, monkeypatch):
  pair = {"options.json": open(FIXTURE_OPTIONS, "rb").read(), "weights.hdf5": open(FIXTURE_WEIGHTS, "rb").read()}
  commit = _seed(hub, "me/pair", pair)
  found = pretrained.resolve_model(f"hf://me/pair@{commit}")
  assert found.weight_file.endswith("weights.hdf5") and loaded.load_model(found).format == "bilm-hdf5"
  for spec, words in (("hf://me", "an hf:// spec is hf://owner/name"), ("hf://me/x@../y", "an hf:// spec is"),
                      ("hf://me/none@main", "hf://me/none@main: 404 .*Repository Not Found"),
                      (f"hf://me/pair@{'0' * 40}", "hf://me/pair@0")):
    with pytest.raises(hub_lib.HubError, match=words) as e:
      pretrained.resolve_model(spec)
    assert "\n" not in str(e.value), spec
  monkeypatch.delenv("HF_TOKEN")
  monkeypatch.setenv("HF_HOME", str(hub.cache.parent / "no_login"))
  monkeypatch.setattr(sys.modules["huggingface_hub.constants"], "HF_TOKEN_PATH", str(hub.cache.parent / "none"))
  with pytest.raises(hub_lib.HubError, match="no Hugging Face token: set HF_TOKEN"):
    hub_lib.push(".", "hf://me/x", [])
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)
  with pytest.raises(hub_lib.HubError, match=r"^hf:// specs need huggingface_hub: pip install 'elmo_jax\[hub\]'$"):
    hub_lib.fetch("hf://me/pair")


def test_push_publishes_only_the_model_privately_and_replaces_an_older_one(hub, folder, tmp_path):
  outside = tmp_path / "secret.txt"
  outside.write_text("a key")
  mine = tmp_path / "mine"
  shutil.copytree(folder, mine)
  (mine / ".env").write_text("HF_TOKEN=hf_secret")
  (mine / "notes.txt").write_text("a stray")
  os.symlink(outside, mine / "link.txt")
  names = push_cli.check_folder(str(mine))
  assert sorted(names) == sorted(_files(folder))  # the model's files and its card: no .env, stray or link
  _seed(hub, "me/old", {"options.json": b"{}", "weights.hdf5": b"old", "README.md": b"# old"})
  pushed = hub_lib.push(str(mine), "hf://me/old", names)
  assert hub.repos["me/old"].commits[pushed.split("@")[1]] == _files(folder)  # the older model's files deleted
  hub_lib.push(str(mine), "hf://me/new", names)
  assert hub.repos["me/new"].private is True and hub.repos["me/new"].commits[hub.repos["me/new"].refs["main"]] == (
      _files(folder))
  hub_lib.push(str(mine), "hf://me/open", names, public=True)
  assert hub.repos["me/open"].private is False
  # a model file that is a link (out of the folder or not) is refused in one line, nothing sent
  linked = tmp_path / "linked"
  shutil.copytree(folder, linked)
  os.remove(linked / "model.safetensors")
  os.symlink(os.path.join(folder, "model.safetensors"), linked / "model.safetensors")
  requests = len(hub.requests)
  with pytest.raises(hub_lib.HubError, match="model.safetensors: not a regular file inside the folder") as e:
    push_cli.check_folder(str(linked))
  assert "\n" not in str(e.value) and len(hub.requests) == requests


@pytest.mark.slow  # two command processes
def test_the_push_command_pushes_a_checked_folder(hub, folder, tmp_path):
  env = {**os.environ, "HF_HUB_CACHE": str(hub.cache), "PYTHONPATH": REPO_ROOT, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-m", "elmo_jax", "push", "--to=hf://me/cli", folder], cwd=REPO_ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  pushed = done.stdout.strip()
  assert pushed == f"hf://me/cli@{hub.repos['me/cli'].refs['main']}"
  assert hub.repos["me/cli"].commits[pushed.split("@")[1]] == _files(folder)
  bad = tmp_path / "bad"
  shutil.copytree(folder, bad)
  os.remove(bad / "README.md")
  refused = subprocess.run([sys.executable, "-m", "elmo_jax", "push", "--to=hf://me/cli2", str(bad)], cwd=REPO_ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
  assert refused.returncode == 1 and refused.stderr.strip() == (
      f"error: {bad}: holds no README.md (the model card convert writes)"), refused.stderr
  assert "me/cli2" not in hub.repos


def test_only_the_files_the_loader_reads_are_fetched(hub, folder):
  stray = b"\0" * (2 << 20)  # a large file no loader reads: never requested, never cached
  commit = _seed(hub, "me/stray", {**_files(folder), "checkpoint.bin": stray, "notes/run.log": b"x"})
  got = pretrained.resolve_model(f"hf://me/stray@{commit}")
  assert _files(got.folder_dir) == _files(folder) and loaded.load_model(got).format == "safetensors"
  assert not any("checkpoint.bin" in path or "notes" in path for _, path in hub.requests)
  assert not any(p.stat().st_size >= len(stray) for p in hub.cache.rglob("blobs/*"))
  pair = {"options.json": open(FIXTURE_OPTIONS, "rb").read(), "weights.hdf5": open(FIXTURE_WEIGHTS, "rb").read()}
  commit = _seed(hub, "me/pair", {**pair, "vocab.txt": b"<S>\n</S>\n", "big.bin": stray})
  assert sorted(os.listdir(os.path.dirname(pretrained.resolve_model(f"hf://me/pair@{commit}").weight_file))) == [
      "options.json", "vocab.txt", "weights.hdf5"]
  # a repository holding no model is one line naming what it holds; nothing is downloaded
  commit = _seed(hub, "me/none", {"README.md": b"# none\n", "big.bin": stray})
  with pytest.raises(hub_lib.HubError, match=r"^hf://me/none@[0-9a-f]{40}: holds no model elmo_jax reads .*it "
                                             r"holds: README.md, big.bin$") as e:
    pretrained.resolve_model(f"hf://me/none@{commit}")
  assert "\n" not in str(e.value) and not any("/resolve/" in path for _, path in hub.requests if "me/none" in path)


def test_model_files_by_format_the_deciding_file_last():
  extra = {"README.md", "stray.bin", "sub/x.txt", ".gitattributes"}
  cases = [({"config.json", "model.safetensors", "vocab.txt", "char.dic", "word.dic"},
            ["config.json", "vocab.txt", "char.dic", "word.dic", "README.md", "model.safetensors"]),
           ({"variables/variables.index", "variables/variables.data-00000-of-00002",
             "variables/variables.data-00001-of-00002", "saved_model.pb"},
            ["variables/variables.data-00000-of-00002", "variables/variables.data-00001-of-00002",
             "variables/variables.index"]),
           ({"config.json", "char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl"},
            ["config.json", "char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl"]),
           ({"elmo_options.json", "elmo_weights.hdf5", "vocab.txt"}, ["elmo_options.json", "vocab.txt",
                                                                       "elmo_weights.hdf5"])]
  for names, want in cases:
    assert hub_lib.model_files("hf://me/x", names | extra) == want, want
  for names, words in (({"config.json", "char.dic", "encoder.pkl"}, "an ELMoForManyLangs model without "
                                                                   "token_embedder.pkl$"),
                       ({"options.json", "a.hdf5", "b.hdf5"}, "holds no model elmo_jax reads"), (set(), "no file$")):
    with pytest.raises(hub_lib.HubError, match=words):
      hub_lib.model_files("hf://me/x", names)


def _closed_port():
  """A port on 127.0.0.1 with nothing listening (bound, never listened on: a connection is refused)."""
  sock = socket.socket()
  sock.bind(("127.0.0.1", 0))
  return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_cached_pinned_commit_needs_no_network_and_an_unreachable_hub_is_one_line(hub, folder, monkeypatch,
                                                                                      capsys):
  commit = _seed(hub, "me/elmo", _files(folder))
  pretrained.resolve_model(f"hf://me/elmo@{commit}")
  pretrained.resolve_model("hf://me/elmo")  # main's commit recorded in the cache
  hub.requests.clear()
  assert _files(pretrained.resolve_model(f"hf://me/elmo@{commit}").folder_dir) == _files(folder)
  assert hub.requests == []  # a commit's files never change: a whole cached snapshot is read as it is
  sock, closed = _closed_port()
  with sock:
    monkeypatch.setenv("HF_ENDPOINT", closed)
    capsys.readouterr()
    start = time.monotonic()
    assert _files(pretrained.resolve_model(f"hf://me/elmo@{commit}").folder_dir) == _files(folder)
    assert capsys.readouterr().err == ""
    # unpinned: the commit the cache last fetched for main, in one line; nothing cached: one line
    assert _files(pretrained.resolve_model("hf://me/elmo").folder_dir) == _files(folder)
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("hf://me/elmo: the Hub is unreachable (ConnectError); using the "
                                              f"cached commit {commit} (set HF_HUB_OFFLINE=1"), err
    with pytest.raises(hub_lib.HubError, match=rf"^hf://me/other: the Hub \({closed}\) is unreachable .* nothing "
                                               r"is cached for it; without a network set HF_HUB_OFFLINE=1 and pin "
                                               r"a cached commit \(hf://me/other@COMMIT\)$") as e:
      pretrained.resolve_model("hf://me/other")
    assert "\n" not in str(e.value) and "Retry" not in capsys.readouterr().err
    assert time.monotonic() - start < 5
  # a Hub that answers 503: the same fallback, in one line, without huggingface_hub's retries
  monkeypatch.setenv("HF_ENDPOINT", hub.url)
  hub.down = True
  start = time.monotonic()
  assert _files(pretrained.resolve_model("hf://me/elmo").folder_dir) == _files(folder)
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "the Hub is unreachable (HfHubHTTPError); using the cached commit" in err, err
  assert time.monotonic() - start < 5


def test_an_elmoformanylangs_repository_fetches_its_architecture_json_and_loads(hub, tmp_path):
  """config.json names the architecture JSON (`../configs/tiny.json`, found by its name): fetched after it, and
  read through the snapshot's link into the cache's blobs/ (a link a local folder may not hold)."""
  local = tmp_path / "efml"
  local.mkdir()
  efml_util.write_model(str(local), zip_format=True)
  commit = _seed(hub, "me/efml", {**_files(str(local)), "stray.bin": b"\0" * 4096})
  found = pretrained.resolve_model(f"hf://me/efml@{commit}")
  assert sorted(os.listdir(found.efml_dir)) == sorted(_files(str(local)))  # tiny.json among them, no stray
  model, want = loaded.load_model(found), loaded.load_model(pretrained.resolve_model(str(local)))
  assert model.format == "efml" and model.options == want.options
  # read from the cache (a pinned commit), the architecture JSON is verified like the rest: changed, refused
  blob = os.path.realpath(os.path.join(found.efml_dir, "tiny.json"))
  with open(blob, "a", encoding="utf-8") as f:
    f.write(" ")
  with pytest.raises(hub_lib.HubError, match=r"tiny.json: its git blob id .* differs from the Hub's"):
    pretrained.resolve_model(f"hf://me/efml@{commit}")
