"""Property-based fuzzing of the parsers of untrusted files (tests/parser_fuzz.py): hypothesis mutates valid
torch.save files (both layouts), a TF-Hub module's bundle and model archives byte by byte, a bounded,
derandomized number of examples, in a child under a memory limit; every mutant loads to the same parameters
or is refused with the parser's one-line error (a legacy torch file, which has no checksum, may load to other
values, as plain data). Needs `hypothesis` (requirements-test.txt)."""
from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import zipfile

import numpy as np
import pytest

import torch_files
from paths import TFHUB_MODULE

EXAMPLES = 200  # per target (7 targets), with the legacy file's single-byte sweep: ~2,400 mutants, ~20 s


def _torch_files(tmp_path) -> tuple[str, str]:
  """A small state dict (a transposed view, float16, int64, a scalar) saved in both layouts: by torch where
  it is installed, else by tests/torch_files.py's writer."""
  rng = np.random.default_rng(0)
  arrays = {"w": rng.standard_normal((3, 4)).astype(np.float32), "ids": np.arange(6, dtype=np.int64),
            "h": np.float16([0.5, -1])}
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    obj, data = torch_files.state(arrays)
    return (torch_files.legacy(tmp_path / "legacy.pkl", obj, data), torch_files.zipped(tmp_path / "zip.pkl", obj, data))
  state = {k: torch.from_numpy(v) for k, v in arrays.items()}
  state["t"], state["s"] = state["w"].t(), torch.tensor(2.5)
  out = []
  for name, zipped in (("legacy.pkl", False), ("zip.pkl", True)):
    torch.save(state, tmp_path / name, _use_new_zipfile_serialization=zipped)
    out.append(str(tmp_path / name))
  return tuple(out)


def _archives(tmp_path) -> tuple[str, str]:
  members = {"m/options.json": b'{"lstm": {"dim": 8}}', "m/w.bin": np.random.default_rng(1).bytes(1500)}
  with tarfile.open(tmp_path / "m.tar.gz", "w:gz") as t:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      t.addfile(info, io.BytesIO(data))
  with zipfile.ZipFile(tmp_path / "m.zip", "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in members.items():
      z.writestr(name, data)
  return str(tmp_path / "m.tar.gz"), str(tmp_path / "m.zip")


@pytest.mark.slow
def test_every_mutant_loads_the_same_or_is_refused_in_one_line(tmp_path):
  pytest.importorskip("hypothesis", reason="pip install -r requirements-test.txt (hypothesis)")
  legacy, zipped = _torch_files(tmp_path)
  module = str(tmp_path / "module")
  shutil.copytree(TFHUB_MODULE, module)
  tar_gz, zip_archive = _archives(tmp_path)
  (tmp_path / "work").mkdir()
  config = {"torch_legacy": legacy, "torch_zip": zipped, "module": module, "tar_gz": tar_gz, "zip": zip_archive,
            "work": str(tmp_path / "work"), "examples": EXAMPLES, "sweep": ["torch_legacy"]}
  results = torch_files.run_limited(f"import parser_fuzz; parser_fuzz.main({json.dumps(config)!r})",
                                    memory=1 << 30, timeout=600)
  by_target = {r["target"]: r for r in results}
  assert len(by_target) == 7, results
  for r in results:
    print(json.dumps(r))  # the counts, for the record (-s)
    assert r["mutants"] >= EXAMPLES and r["refused"] > 0 and r["slowest_s"] < 5, r
    if r["target"] not in ("torch.save legacy", "torch.save zip, data.pkl (re-zipped)"):  # no checksum there
      assert r["differs"] == 0, r
  assert by_target["torch.save legacy"]["mutants"] > EXAMPLES + os.path.getsize(legacy) - 1  # the sweep ran
