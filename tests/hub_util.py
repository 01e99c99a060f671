"""A fake Hugging Face Hub on 127.0.0.1: the endpoints huggingface_hub calls to download a snapshot (revision
info, the recursive tree with LFS sha256s, HEAD / GET of `resolve`) and to push (create a repo, check the
card's metadata, preupload, commit), over in-memory repositories. Point huggingface_hub at it with
`HF_ENDPOINT` (the `hub` fixture).

Every uploaded file is taken in the commit's body ("regular" upload mode); files named like model weights are
listed and served as LFS files (their sha256 in the tree's `lfs.oid` and the `ETag`), as the Hub does.
`server.tamper` holds "repo/path" names whose bytes are served altered while the metadata keeps the true hash;
`server.down` makes every GET a 503.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import threading
import urllib.parse

import pytest

LFS_SUFFIXES = (".safetensors", ".hdf5", ".pkl", ".index", "-of-00001")


def git_blob_id(data: bytes) -> str:
  return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
  """Commits as {path: bytes} by commit id; refs (branches, tags) name commits."""

  def __init__(self):
    self.commits: dict[str, dict[str, bytes]] = {}
    self.refs: dict[str, str] = {}

  def commit(self, files: dict[str, bytes], ref: str = "main", deleted: tuple[str, ...] = ()) -> str:
    parent = self.commits.get(self.refs.get(ref, ""), {})
    tree = {p: d for p, d in {**parent, **files}.items() if p not in deleted}
    oid = hashlib.sha1(json.dumps({p: git_blob_id(d) for p, d in sorted(tree.items())}).encode()
                       + str(len(self.commits)).encode()).hexdigest()
    self.commits[oid], self.refs[ref] = tree, oid
    return oid

  def resolve(self, rev: str) -> str | None:
    return rev if rev in self.commits else self.refs.get(rev)


def _is_lfs(path: str) -> bool:
  return path.endswith(LFS_SUFFIXES)


def _blob(path: str, data: bytes) -> dict:
  """A sibling's metadata as the revision route gives it with `blobs=True`."""
  return {"blobId": git_blob_id(data), "size": len(data),
          **({"lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}}
             if _is_lfs(path) else {})}


class HubHandler(http.server.BaseHTTPRequestHandler):
  """The Hub's routes, over `self.server.repos` ({repo id: Repo})."""

  def log_message(self, *args):
    pass

  def _reply(self, code: int, body: bytes = b"", headers: dict | None = None, error: str | None = None):
    self.send_response(code)
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    if error:
      self.send_header("X-Error-Code", error)
      self.send_header("X-Error-Message", error)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _json(self, obj, code: int = 200):
    self._reply(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

  def _route(self):
    url = urllib.parse.urlparse(self.path)
    parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
    if parts[:2] == ["api", "models"] and len(parts) >= 6:
      return "/".join(parts[2:4]), parts[4], parts[5], "/".join(parts[6:])
    if len(parts) >= 4 and parts[2] == "resolve":
      return "/".join(parts[:2]), "resolve", parts[3], "/".join(parts[4:])
    return None, None, None, None

  def do_HEAD(self):  # noqa: N802
    self.do_GET()

  def do_GET(self):  # noqa: N802
    self.server.requests.append((self.command, self.path))
    if self.server.down:  # a Hub that answers but cannot serve (503)
      return self._reply(503, error="ServiceUnavailable")
    repo_id, route, rev, path = self._route()
    repo = self.server.repos.get(repo_id)
    if repo is None:
      return self._reply(404, error="RepoNotFound")
    commit = repo.resolve(rev)
    if commit is None:
      return self._reply(404, error="RevisionNotFound")
    tree = repo.commits[commit]
    if route == "revision":
      blobs = "blobs=" in urllib.parse.urlparse(self.path).query  # files_metadata=True: sizes and hashes
      return self._json({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                         "siblings": [{"rfilename": p, **(_blob(p, d) if blobs else {})}
                                      for p, d in sorted(tree.items())]})
    if route == "tree":
      return self._json([{"type": "file", "oid": git_blob_id(d), "size": len(d), "path": p,
                          **({"lfs": {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134}}
                             if _is_lfs(p) else {})} for p, d in sorted(tree.items())])
    if route == "resolve" and path in tree:
      data = tree[path]
      etag = hashlib.sha256(data).hexdigest() if _is_lfs(path) else git_blob_id(data)
      if f"{repo_id}/{path}" in self.server.tamper:
        data = bytes([data[0] ^ 0xFF]) + data[1:]
      return self._reply(200, data, {"ETag": f'"{etag}"', "X-Repo-Commit": commit,
                                     "Content-Type": "application/octet-stream"})
    return self._reply(404, error="EntryNotFound")

  def do_POST(self):  # noqa: N802
    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
    self.server.requests.append((self.command, self.path))
    if self.path.startswith("/api/validate-yaml"):  # a README.md's metadata: accepted
      return self._json({"errors": [], "warnings": []})
    if self.path.startswith("/api/repos/create"):
      req = json.loads(body)
      repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
      if repo_id in self.server.repos:  # the Hub's 409 carries the repository's url, as its 200 does
        return self._reply(409, json.dumps({"error": "You already created this model repo",
                                            "url": f"{self.server.url}/{repo_id}"}).encode(),
                           {"Content-Type": "application/json"}, error="RepoExists")
      self.server.repos[repo_id] = Repo()
      self.server.repos[repo_id].private = req.get("private", {"private": True, "public": False}.get(
          req.get("visibility")))
      return self._json({"url": f"{self.server.url}/{repo_id}", "name": repo_id})
    repo_id, route, rev, _ = self._route()
    repo = self.server.repos.get(repo_id)
    if repo is None:
      return self._reply(404, error="RepoNotFound")
    if route == "preupload":
      files = json.loads(body)["files"]
      return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                   for f in files]})
    if route == "commit":
      added, deleted = {}, []
      for line in body.decode().splitlines():
        item = json.loads(line)
        if item["key"] == "file":
          added[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        if item["key"] == "deletedFile":
          deleted.append(item["value"]["path"])
      oid = repo.commit(added, rev, tuple(deleted))
      return self._json({"commitUrl": f"{self.server.url}/{repo_id}/commit/{oid}", "commitOid": oid,
                         "pullRequestUrl": None})
    return self._reply(404, error="EntryNotFound")


@contextlib.contextmanager
def serve():
  """A fake Hub on a free port; yields the server (`repos`, `tamper`, `requests`, `down`, `url`)."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
  server.repos, server.tamper, server.requests, server.down = {}, set(), [], False
  server.url = f"http://127.0.0.1:{server.server_address[1]}"
  # shutdown() returns at the loop's next poll: socketserver's default of 0.5 s would add that to every test
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
  thread.start()
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()


@pytest.fixture
def hub(tmp_path, monkeypatch):
  """The fake Hub, with huggingface_hub pointed at it and at an empty cache of this test's (and a token)."""
  pytest.importorskip("huggingface_hub", reason="pip install -r requirements-test.txt (huggingface_hub)")
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  with serve() as server:
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_cache"))
    server.cache = tmp_path / "hf_cache"
    yield server
