"""`hf://owner/name@revision` model specs: a Hugging Face Hub repository, downloaded through `huggingface_hub`.

    folder = hub.fetch("hf://owner/elmo-small@v1")     # the snapshot's local folder, every file verified
    hub.push("elmo_small/", "hf://owner/elmo-small")    # a model folder uploaded with the user's token

The repository holds any model folder `resolve_model` reads (elmo_jax's own safetensors folder, options.json +
weights.hdf5, an ELMoForManyLangs folder, a TF-Hub module); `resolve_model` resolves the spec to the snapshot
folder and reads it as a local folder. The revision is a branch, a tag or a commit hash; without `@revision`
the spec is unpinned: `main` is resolved to its commit and one line says which (pin it with that hash).

Downloads go to huggingface_hub's own cache (`HF_HUB_CACHE` / `HF_HOME`, shared with every other tool that
uses it); `HF_ENDPOINT` names another Hub; `HF_HUB_OFFLINE=1` (read at each call) or no network uses the cache
alone. Every file of the snapshot is checked before it is used, online and offline: an LFS file's sha256
against the Hub's metadata (the tree listing's `lfs.sha256` online; offline, the name the cache stored it
under, which is the sha256 the Hub sent with it), a small file's git blob id the same way. A file that
differs is refused in one line and its cached copy deleted, so the next run downloads it again.

`huggingface_hub` is the `hub` extra (`pip install 'elmo_jax[hub]'`); without it an `hf://` spec is one line.
"""
from __future__ import annotations

import hashlib
import os
import re
import stat
import sys

from elmo_jax.formats.checks import one_line
from elmo_jax.runtime import log
from elmo_jax.sources import download

SCHEME = "hf://"
_SPEC = re.compile(r"hf://([A-Za-z0-9][\w.-]*/[\w.-]+)(?:@([\w./-]+))?/?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


class HubError(download.DownloadError):
  """An `hf://` spec that cannot be fetched, verified or pushed; one line naming the spec (and the file)."""


def is_hub_spec(text: str | os.PathLike) -> bool:
  return os.fspath(text).startswith(SCHEME)


def parse(spec: str) -> tuple[str, str | None]:
  """(repo id, revision or None) of `hf://owner/name[@revision]`; HubError for anything else."""
  m = _SPEC.fullmatch(spec)
  if m is None or ".." in spec:
    raise HubError(f"{spec}: an hf:// spec is hf://owner/name or hf://owner/name@revision (a branch, tag or commit)")
  return m.group(1), m.group(2)


def _hf():
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise HubError("hf:// specs need huggingface_hub: pip install 'elmo_jax[hub]'") from None
  return huggingface_hub


def _offline() -> bool:
  """HF_HUB_OFFLINE as huggingface_hub reads it, but at each call (the library reads it once, at import)."""
  return (os.environ.get("HF_HUB_OFFLINE") or "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _endpoint() -> str | None:
  return os.environ.get("HF_ENDPOINT") or None


def _hub_errors(hf) -> tuple[type[BaseException], ...]:
  """What a download, listing or upload raises for a missing repo, revision or file, a refused token, a Hub
  that cannot be reached (httpx's errors included) or a cache that lacks the files."""
  import httpx2  # pylint: disable=g-import-not-at-top  (huggingface_hub's HTTP client)
  return (hf.errors.HfHubHTTPError, hf.errors.EntryNotFoundError, hf.errors.HFValidationError, httpx2.HTTPError,
          ConnectionError, OSError, ValueError)


def fetch(spec: str) -> str:
  """The local snapshot folder of `spec`, downloaded once (then from the cache), every file verified."""
  hf = _hf()
  repo, revision = parse(spec)
  try:
    folder = hf.snapshot_download(repo, revision=revision or "main", endpoint=_endpoint(),
                                  local_files_only=_offline())
  except _hub_errors(hf) as e:
    where = " (offline: nothing cached for it)" if _offline() else ""
    raise HubError(f"{spec}{where}: {one_line(e)}") from None
  try:  # the Hub's hashes; with no network (snapshot_download then used the cache), the cache's names of them
    expected = None if _offline() else _tree(hf, repo, os.path.basename(folder))
  except _hub_errors(hf):
    expected = None
  if revision is None:
    log.info(f"{spec}: unpinned; main is commit {os.path.basename(folder)} (pin it: hf://{repo}@"
             f"{os.path.basename(folder)})", stream=sys.stderr)
  verify(spec, folder, expected)
  return folder


def _tree(hf, repo: str, commit: str) -> dict[str, tuple[str, str]]:
  """{path: ("sha256" or "git", the Hub's hash)} of every file at `commit`: what each download must hash to."""
  from huggingface_hub.hf_api import RepoFile  # pylint: disable=g-import-not-at-top
  api = hf.HfApi(endpoint=_endpoint())
  out = {}
  for f in api.list_repo_tree(repo, revision=commit, recursive=True):
    if isinstance(f, RepoFile):
      out[f.path] = ("sha256", f.lfs.sha256) if f.lfs is not None else ("git", f.blob_id)
  return out


def _hash(path: str, kind: str) -> str:
  """sha256 of the bytes, or git's blob id (sha1 of "blob <size>\\0" + bytes) for `kind` "git"."""
  digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def verify(spec: str, folder: str, expected: dict[str, tuple[str, str]] | None) -> None:
  """Checks every file of a snapshot folder against `expected` (the Hub's listing), or offline (None) against
  the blob name the cache stored it under; a file that differs is refused (HubError) and its cached copy and
  link deleted."""
  for top, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(top, name)
      rel = os.path.relpath(path, folder).replace(os.sep, "/")
      blob = os.path.realpath(path)
      stored = os.path.basename(blob)
      kind, want = expected.get(rel, (None, None)) if expected is not None else (
          ("sha256", stored) if re.fullmatch(r"[0-9a-f]{64}", stored) else
          ("git", stored) if _COMMIT.fullmatch(stored) else (None, None))
      if want is None:
        why = "not in the Hub's listing" if expected is not None else "a cached file not stored under its hash"
        raise HubError(f"{spec}: {rel}: no hash to check it against ({why}); delete {path} and fetch again")
      got = _hash(blob, kind)
      if got != want:
        for p in {blob, path}:
          if os.path.lexists(p):
            os.remove(p)
        raise HubError(f"{spec}: {rel}: its {'sha256' if kind == 'sha256' else 'git blob id'} {got[:16]}... differs "
                       f"from the Hub's {want[:16]}...; the cached copy is deleted")


def publishable(folder: str, paths: list[str]) -> list[str]:
  """The names (relative to `folder`, `/`-separated) of `paths`, the files a model's loader reads, each a regular
  file inside `folder`: HubError (one line) for a symlink, a file outside the folder or a dotfile, which a push
  would publish (a link's target's content, a `.env`)."""
  root, names = os.path.realpath(folder), []
  for path in dict.fromkeys(paths):
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(folder)).replace(os.sep, "/")
    if rel.startswith("../") or rel == ".." or os.path.isabs(rel):
      raise HubError(f"{path}: the model reads it from outside {folder}; copy it into the folder to push it")
    if any(part.startswith(".") for part in rel.split("/")):
      raise HubError(f"{folder}/{rel}: a hidden file is not pushed; rename it")
    st = os.lstat(path)
    if os.path.islink(path) or not stat.S_ISREG(st.st_mode) or not os.path.realpath(path).startswith(root + os.sep):
      raise HubError(f"{folder}/{rel}: not a regular file inside the folder (a symlink?); a push publishes a "
                     "model's own files only: copy the file in")
    names.append(rel)
  return names


def push(folder: str, spec: str, names: list[str], message: str | None = None, public: bool = False) -> str:
  """Uploads exactly `names` (`publishable`'s) of `folder` to the repository `spec` names, created private
  (`public`: public) if missing, and deletes the repository's other files (an older model's) in the same
  commit; the token of `HF_TOKEN` or huggingface_hub's login; returns `hf://owner/name@<commit>`. The caller
  checks the folder first (it must load)."""
  hf = _hf()
  repo, revision = parse(spec)
  token = hf.get_token()
  if not token:
    raise HubError(f"{spec}: no Hugging Face token: set HF_TOKEN or run `hf auth login`")
  api = hf.HfApi(endpoint=_endpoint(), token=token)
  try:
    api.create_repo(repo, exist_ok=True, private=not public)
    try:
      old = set(api.list_repo_files(repo, revision=revision))
    except hf.errors.RevisionNotFoundError:
      old = set()  # a new repository (or branch): nothing to delete
    operations = [hf.CommitOperationAdd(path_in_repo=name, path_or_fileobj=os.path.join(folder, name))
                  for name in names]
    operations += [hf.CommitOperationDelete(path_in_repo=name) for name in sorted(old - set(names))
                   if name != ".gitattributes"]
    info = api.create_commit(repo, operations, revision=revision,
                             commit_message=message or f"elmo-jax push {os.path.basename(os.path.abspath(folder))}")
  except _hub_errors(hf) as e:
    raise HubError(f"{spec}: {one_line(e)}") from None
  return f"hf://{repo}@{info.oid}"
