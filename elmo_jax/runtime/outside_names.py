"""Names that come from outside (a bucket object, an archive member, a config's path, a manifest entry) made
into local paths that stay inside their folder: `name_parts` refuses what could leave it, `inside` also what a
link would lead out."""
from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any


class OutsideNameError(ValueError):
  """A name that came from outside (a bucket object, an archive member, a config's path, a manifest entry)
  that is not a plain name under its folder; one line naming it."""


_DRIVE = re.compile(r"^[A-Za-z]:")


def name_parts(name: Any, what: str = "a name") -> list[str]:
  """The path parts of `name`, a name that came from outside (`/`-separated; empty and `.` parts dropped);
  refuses (OutsideNameError, one line) whatever could leave the folder it is put under: `..`, an absolute
  path, a drive letter (`C:`), a backslash, a control character, or any of them percent-encoded (`%2e%2e`)."""
  if not isinstance(name, str) or not name.strip("/."):
    raise OutsideNameError(f"{what} {name!r} is not a file name")
  seen = [name]
  while (step := urllib.parse.unquote(seen[-1])) not in seen:  # `%252e` is `%2e` is `.`
    seen.append(step)
  for text in seen:
    problem = ("has an absolute path" if text.startswith(("/", "\\"))
               else "has an absolute path (a drive letter)" if _DRIVE.match(text)
               else "climbs out of its folder (..)" if ".." in re.split(r"[\\/]", text)
               else "holds a backslash (a Windows path?)" if "\\" in text
               else "holds a control character" if any(ord(c) < 32 or ord(c) == 127 for c in text) else None)
    if problem is not None:
      encoded = "" if text == name else f" (decoded: {text!r})"
      raise OutsideNameError(f"{what} {name!r}{encoded} {problem}: a name from outside must stay in its folder")
  return [p for p in name.split("/") if p not in ("", ".")]


def inside(root: str | os.PathLike, name: Any, what: str = "a name", links_into: str | None = None) -> str:
  """The path under `root` that the outside `name` means (`name_parts`' checks), also refused when a link
  already under `root` would lead it out (`links_into`: the one other folder its links may lead into, e.g. a
  Hugging Face cache snapshot's blobs/). The one way a name from a bucket, an archive, a config or a
  manifest becomes a local path."""
  root = os.fspath(root)
  path = os.path.join(root, *name_parts(name, what))
  real_root = os.path.realpath(root)
  real = os.path.realpath(path)
  if not within(real, real_root) and not (links_into is not None and within(real, os.path.realpath(links_into))):
    raise OutsideNameError(f"{what} {name!r} leads out of {root} through a link")
  return path


def within(path: str, folder: str) -> bool:
  """`path` is `folder` or lies under it (both real paths: links resolved)."""
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)
