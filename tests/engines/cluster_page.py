"""docs/cluster.md's Python blocks, for the tests that run them (its Ray blocks: test_ray_engine.py; its Beam
block, in the beam extra's environment: test_beam.py)."""
from __future__ import annotations

import os
import re

from paths import FIXTURE_DIR, REPO_ROOT


def page_python_blocks(needs: str) -> list[str]:
  """The page's Python blocks that hold `needs` (e.g. "import ray"), with the released name `small` as bilm-tf's
  fixture folder."""
  with open(os.path.join(REPO_ROOT, "docs", "cluster.md"), encoding="utf-8") as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  return [b.replace('"small"', repr(FIXTURE_DIR)) for b in blocks if needs in b]
