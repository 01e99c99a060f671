"""AllenNLP's `Elmo` as a latency baseline, next to torch 2.x (benchmarks/embed_latency.py).

AllenNLP 2.10.1 pins torch < 1.13, so it is installed on its own, without its dependencies, into a folder:

    python -m pip install --no-deps --target /tmp/allennlp_pkg allennlp==2.10.1

`allennlp/modules/elmo.py` (its `Elmo`, `_ElmoBiLm`, `ElmoLstm`, `_ElmoCharacterEncoder`, `batch_to_ids`)
runs unchanged on the torch installed here; the packages that `allennlp/__init__` and `allennlp.common`
import but `Elmo` never calls (transformers, spacy, nltk, ...; `STUBBED`) are stubbed when they are not
installed. The model is the same options.json + weights.hdf5 our Embedder reads, so the two compute the
same layers (`check` compares them).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any, Sequence

import numpy as np

STUBBED = ("transformers", "spacy", "nltk", "wandb", "huggingface_hub", "cached_path", "sentencepiece",
           "termcolor", "fairscale", "lmdb", "_jsonnet", "boto3", "botocore", "base58", "dill", "tensorboardX",
           "datasets", "sacremoses", "more_itertools", "overrides", "torchvision")


class _AnyModule(types.ModuleType):
  """A stub: every attribute is a do-nothing class (so `from x import Y` and `class Z(Y)` both work)."""
  __path__: list[str] = []

  def __getattr__(self, name: str) -> Any:
    if name.startswith("__"):
      raise AttributeError(name)
    return type(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Last on `sys.meta_path`: answers only for `STUBBED` packages no other finder found."""

  def find_spec(self, name, path, target=None):  # pylint: disable=unused-argument
    if name.split(".")[0] in STUBBED:
      return importlib.machinery.ModuleSpec(name, self, is_package=True)
    return None

  def create_module(self, spec):
    return _AnyModule(spec.name)

  def exec_module(self, module):
    pass


def import_elmo(path: str) -> Any:
  """`allennlp.modules.elmo` from the folder `path` (pip --target), stubs for what it does not use."""
  if not os.path.isdir(os.path.join(path, "allennlp")):
    raise ImportError(f"{path}: no allennlp package (python -m pip install --no-deps --target {path} "
                      "allennlp==2.10.1)")
  sys.path.append(path)
  sys.meta_path.append(_StubFinder())
  import allennlp.modules.elmo as elmo_module  # pylint: disable=g-import-not-at-top
  import allennlp.modules.elmo_lstm as lstm_module  # pylint: disable=g-import-not-at-top
  for module in (elmo_module, lstm_module):  # local files: what AllenNLP's cached_path returns for them
    module.cached_path = lambda path, *args, **kwargs: path
  return elmo_module


class AllenNLPElmo:
  """`Elmo(options_file, weight_file, 1, dropout=0)` as an AllenNLP user calls it: `__call__(sentences)` is
  `batch_to_ids`, the forward under `torch.no_grad` and the mixed representation copied to numpy."""

  def __init__(self, path: str, options_file: str, weight_file: str):
    import torch  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.module = import_elmo(path)
    self.elmo = self.module.Elmo(options_file, weight_file, 1, dropout=0.0, requires_grad=False)
    self.elmo.eval()

  def __call__(self, sentences: Sequence[Sequence[str]]) -> np.ndarray:
    with self.torch.no_grad():
      out = self.elmo(self.module.batch_to_ids([list(s) for s in sentences]))
      return out["elmo_representations"][0].numpy()

  def layers(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Each sentence's biLM layers `[n_layers + 1, n_tokens, 2P]` (AllenNLP's `_elmo_lstm` activations)."""
    with self.torch.no_grad():
      ids = self.module.batch_to_ids([list(s) for s in sentences])
      bilm = self.elmo._elmo_lstm(ids)  # pylint: disable=protected-access
      acts = [a.numpy() for a in bilm["activations"]]  # [batch, time + 2, 2P] each, with <S>, </S>
    return [np.stack([a[i, 1:1 + len(s)] for a in acts]) for i, s in enumerate(sentences)]
