"""`hf://owner/name@revision` model specs: a Hugging Face Hub repository, downloaded through `huggingface_hub`.

    folder = hub.fetch("hf://owner/elmo-small@v1")     # the loader's files of the snapshot, each verified
    hub.push("elmo_small/", "hf://owner/elmo-small")    # a model folder uploaded with the user's token

The repository holds any model folder `resolve_model` reads (elmo_jax's own safetensors folder, options.json +
weights.hdf5, an ELMoForManyLangs folder, a TF-Hub module); only the files its loader reads are downloaded
(`model_files`, from the Hub's listing: what `push` publishes, never a stray), and `resolve_model` reads the
snapshot folder as a local folder. The revision is a branch, a tag or a commit hash; without `@revision` the
spec is unpinned: `main` is resolved to its commit and one line says which (pin it with that hash).

Downloads go to huggingface_hub's own cache (`HF_HUB_CACHE` / `HF_HOME`, shared with every other tool that
uses it); `HF_ENDPOINT` names another Hub. A pinned commit whose files are cached is read with no request (a
commit never changes); `HF_HUB_OFFLINE=1` (read at each call) uses the cache alone; a branch or tag costs one
listing request, without huggingface_hub's retries, and an unreachable Hub falls back to the commit the cache
last fetched for it (one line), or is one line. Every file read is checked before it is used, online and
offline: an LFS file's sha256 against the Hub's metadata (the listing's `lfs.sha256` online; offline, the name
the cache stored it under, which is the sha256 the Hub sent with it), a small file's git blob id the same way.
A file that differs is refused in one line and its cached copy deleted, so the next run downloads it again.

`huggingface_hub` is the `hub` extra (`pip install 'elmo_jax[hub]'`); without it an `hf://` spec is one line.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
import sys

from elmo_jax.data import lexicon
from elmo_jax.formats import efml
from elmo_jax.formats import model_folder
from elmo_jax.formats import tfhub
from elmo_jax.formats.checks import one_line
from elmo_jax.runtime import files as files_lib
from elmo_jax.runtime import log
from elmo_jax.runtime import outside_names
from elmo_jax.runtime.run_layout import OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE
from elmo_jax.sources import download

SCHEME = "hf://"
_SPEC = re.compile(r"hf://([A-Za-z0-9][\w.-]*/[\w.-]+)(?:@([\w./-]+))?/?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# The one listing request: a Hub that does not answer costs seconds (huggingface_hub's own backoff retries a
# refused connection for ~25 s, a line each time).
CONNECT_TIMEOUT_S, LIST_TIMEOUT_S = 5.0, 30.0


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
    import huggingface_hub.constants  # pylint: disable=g-import-not-at-top,unused-import  (not a lazy attribute)
    import huggingface_hub.errors  # pylint: disable=g-import-not-at-top,unused-import
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
  """The local snapshot folder of `spec` holding the files its model's loader reads (`model_files`; nothing
  else of the repository is downloaded), every one verified. A pinned commit whose files are all cached is read
  with no request at all; `HF_HUB_OFFLINE=1` reads the cache alone; an unpinned spec asks the Hub once for the
  commit and the listing (no retries), and with the Hub unreachable falls back, in one line, to the commit the
  cache last fetched for that revision, or fails in one line."""
  hf = _hf()
  repo, revision = parse(spec)
  pinned = revision is not None and _COMMIT.fullmatch(revision) is not None
  cached = _cached(hf, repo, revision or "main")
  if cached is not None and (pinned or _offline()):
    return _verified(spec, cached, None)
  if _offline():
    raise HubError(f"{spec} (offline: nothing cached for it): HF_HUB_OFFLINE=1 reads the cache alone; fetch it "
                   "once with the Hub reachable")
  try:
    commit, expected = _listing(hf, repo, revision or "main")
  except _hub_errors(hf) as e:
    if not _unreachable(hf, e):
      raise HubError(f"{spec}: {one_line(e)}") from None
    if cached is None:
      raise HubError(f"{spec}: the Hub ({_endpoint() or hf.constants.ENDPOINT}) is unreachable "
                     f"({type(e).__name__}: {one_line(e)[:80]}) and nothing is cached for it; without a network set "
                     f"HF_HUB_OFFLINE=1 and pin a cached commit (hf://{repo}@COMMIT)") from None
    log.info(f"{spec}: the Hub is unreachable ({type(e).__name__}); using the cached commit "
             f"{os.path.basename(cached)} (set HF_HUB_OFFLINE=1 to skip the Hub; pin it: hf://{repo}@"
             f"{os.path.basename(cached)})", stream=sys.stderr)
    return _verified(spec, cached, None)
  folder, names = _download(hf, spec, repo, commit, expected)
  if not pinned:
    _remember(hf, repo, revision or "main", commit)
  if revision is None:
    log.info(f"{spec}: unpinned; main is commit {commit} (pin it: hf://{repo}@{commit})", stream=sys.stderr)
  verify(spec, folder, expected, names)
  return folder


def _verified(spec: str, folder: str, expected: dict[str, tuple[str, str]] | None) -> str:
  """`folder` once the files a load reads there (`model_files`, an EFML folder's architecture JSON) verify."""
  present = _names_in(folder)
  names = model_files(spec, present)
  if names[-1] == efml.ENCODER:
    names += [n for n in efml.architecture_names(folder) if n in present and n not in names]
  verify(spec, folder, expected, names)
  return folder


def _unreachable(hf, e: BaseException) -> bool:
  """Whether `e` says the Hub could not be reached or could not answer (no connection, a timeout, offline mode,
  a 5xx), not that it refused (a missing repository or revision, a token)."""
  import httpx2  # pylint: disable=g-import-not-at-top  (huggingface_hub's HTTP client)
  if isinstance(e, (httpx2.TransportError, hf.errors.OfflineModeIsEnabled, ConnectionError, TimeoutError)):
    return True
  status = getattr(getattr(e, "response", None), "status_code", None)
  return isinstance(e, hf.errors.HfHubHTTPError) and isinstance(status, int) and status >= 500


def _repo_cache(hf, repo: str) -> str:
  """huggingface_hub's cache folder of a model repository (`HF_HUB_CACHE`, read at each call)."""
  return os.path.join(hf.constants.HF_HUB_CACHE, "models--" + repo.replace("/", "--"))


def _cached(hf, repo: str, revision: str) -> str | None:
  """The cached snapshot folder of `revision` (a commit, or a branch or tag through the cache's refs/) if it
  holds a whole model (`model_files` finds one: its deciding file is fetched last, so the rest is there), else
  None. Reads the disk only."""
  root = _repo_cache(hf, repo)
  commit = revision
  if _COMMIT.fullmatch(revision) is None:
    try:
      with open(os.path.join(root, "refs", *revision.split("/")), encoding="utf-8") as f:
        commit = f.read().strip()
    except OSError:
      return None
  folder = os.path.join(root, "snapshots", commit)
  if _COMMIT.fullmatch(commit) is None or not os.path.isdir(folder):
    return None
  try:
    model_files(repo, _names_in(folder))
  except HubError:
    return None
  return folder


def _names_in(folder: str) -> list[str]:
  return [os.path.relpath(os.path.join(top, n), folder).replace(os.sep, "/")
          for top, _, names in os.walk(folder) for n in names]


def _listing(hf, repo: str, revision: str) -> tuple[str, dict[str, tuple[str, str]]]:
  """(commit, {path: ("sha256" or "git", the Hub's hash)}) of `revision`: one request, no retries, a short
  timeout (a Hub that does not answer costs seconds, not huggingface_hub's backoff)."""
  import httpx2  # pylint: disable=g-import-not-at-top
  info = hf.HfApi(endpoint=_endpoint()).model_info(repo, revision=revision, files_metadata=True,
                                                   timeout=httpx2.Timeout(LIST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
  files = {s.rfilename: ("sha256", s.lfs.sha256) if s.lfs is not None else ("git", s.blob_id)
           for s in info.siblings or ()}
  return info.sha, files


def _download(hf, spec: str, repo: str, commit: str,
              expected: dict[str, tuple[str, str]]) -> tuple[str, list[str]]:
  """Downloads `model_files` of the listing, one by one in their order (an ELMoForManyLangs folder's
  architecture JSON once its config.json names it); returns the snapshot folder and the names downloaded."""
  names = model_files(spec, expected)
  folder = os.path.join(_repo_cache(hf, repo), "snapshots", commit)
  try:
    for i, name in enumerate(names):
      hf.hf_hub_download(repo, name, revision=commit, endpoint=_endpoint())
      if name == efml.CONFIG and names[-1] == efml.ENCODER and i == 0:
        names[1:1] = [n for n in efml.architecture_names(folder) if n in expected and n not in names]
  except _hub_errors(hf) as e:
    raise HubError(f"{spec}: {one_line(e)}") from None
  return folder, names


def _remember(hf, repo: str, revision: str, commit: str) -> None:
  """Records `revision` -> `commit` in the cache's refs/ (as huggingface_hub does) once the files are there,
  so the revision is found offline and when the Hub is unreachable."""
  path = os.path.join(_repo_cache(hf, repo), "refs", *outside_names.name_parts(revision, "a revision"))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with files_lib.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    f.write(commit)


def model_files(spec: str, names) -> list[str]:
  """Which of `names` (a repository's or a snapshot's files, `/`-separated) the loader of the model they hold
  reads, the formats tried in `resolve_model`'s order for a folder, in download order: the file that makes the
  folder that model's (model.safetensors, encoder.pkl, variables.index, the .hdf5) last, so a snapshot that
  holds it holds the rest. elmo_jax's folder: config.json, its vocabulary, lexicons and card (what `push`
  publishes), model.safetensors; a TF-Hub module: variables/'s shards and index; an ELMoForManyLangs folder:
  config.json, char.dic, word.dic, token_embedder.pkl, encoder.pkl (and the architecture JSON config.json
  names); options.json + weights.hdf5 (+ vocab.txt). HubError (one line) for names holding none of them."""
  names = set(names)
  top = sorted(n for n in names if "/" not in n)
  if {model_folder.CONFIG, model_folder.WEIGHTS} <= names:
    extras = (VOCAB_FILE, lexicon.CHAR_DIC, lexicon.WORD_DIC, model_folder.CARD)
    return [model_folder.CONFIG, *(n for n in extras if n in names), model_folder.WEIGHTS]
  index = "/".join(os.path.split(tfhub.VARIABLES)) + ".index"
  if index in names:
    shards = sorted(n for n in names if re.fullmatch(re.escape(index[:-6]) + r"\.data-\d{5}-of-\d{5}", n))
    return [*shards, index]
  efml_names = [n for n in (efml.CONFIG, efml.CHAR_DIC, efml.WORD_DIC, efml.TOKEN_EMBEDDER, efml.ENCODER)
                if n in names]
  if len(efml_names) >= 2:  # as efml.folder_problem: two of its names make a folder EFML's
    missing = [n for n in (efml.CONFIG, efml.CHAR_DIC, efml.TOKEN_EMBEDDER, efml.ENCODER) if n not in names]
    if missing:
      raise HubError(f"{spec}: an ELMoForManyLangs model without {', '.join(missing)}")
    return [n for n in (efml.CONFIG, efml.CHAR_DIC, efml.WORD_DIC, efml.TOKEN_EMBEDDER, efml.ENCODER) if n in names]
  pair = []
  for patterns in ((OPTIONS_FILE, "*options*.json"), (WEIGHTS_FILE, "*weights*.hdf5", "*.hdf5")):  # as a folder's
    pair += next(([m[0]] for m in (fnmatch.filter(top, p) for p in patterns) if len(m) == 1), [])
  if len(pair) == 2:
    return [pair[0], *([VOCAB_FILE] if VOCAB_FILE in names else []), pair[1]]
  shown = ", ".join(sorted(names)[:6]) + (", ..." if len(names) > 6 else "")
  raise HubError(f"{spec}: holds no model elmo_jax reads (config.json + model.safetensors, options.json + "
                 f"weights.hdf5, an ELMoForManyLangs folder or a TF-Hub module's variables/); it holds: "
                 f"{shown or 'no file'}")


def _hash(path: str, kind: str) -> str:
  """sha256 of the bytes, or git's blob id (sha1 of "blob <size>\\0" + bytes) for `kind` "git"."""
  digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def verify(spec: str, folder: str, expected: dict[str, tuple[str, str]] | None, names: list[str]) -> None:
  """Checks the files `names` of a snapshot folder (`model_files`') against `expected` (the Hub's listing), or
  offline (None) against the blob name the cache stored each under; a file that differs is refused (HubError)
  and its cached copy and link deleted."""
  for rel in names:
    path = os.path.join(folder, *rel.split("/"))
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
