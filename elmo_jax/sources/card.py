"""A model folder's card (README.md): what the model is, where it came from, how it was checked, how to load it.

    diff = card.max_difference(source_model, folder_model)   # the biLM's layers on `SENTENCES`: 0.0 when exact
    text = card.text("small", source_model, diff)            # the card's markdown

The check runs both models through the same code (`BiLM` on the same char ids, one compiled program), so any
difference is the weights'. The source's files are named with their sha256, so the card says which bytes it was
converted from.
"""
from __future__ import annotations

import os

import jax
import numpy as np

from elmo_jax.data import chars
from elmo_jax.model import make_model
from elmo_jax.runtime import files
from elmo_jax.sources import loaded

# A fixed sentence set: ASCII words and punctuation, digits, Latin and CJK characters beyond ASCII, a token
# longer than a token's char ids hold (cut), a one-token sentence.
SENTENCES = (
    ("The", "bank", "flooded", "after", "the", "storm", "."),
    ("She", "sat", "on", "the", "river", "bank", "in", "1999", ",", "reading", "."),
    ("Über", "naïve", "façades", "—", "déjà", "vu", "!"),
    ("中文", "模型", "也", "可以", "。"),
    ("pneumonoultramicroscopicsilicovolcanoconiosis" * 2, "is", "long"),
    ("Hello",),
)


def char_ids(model: loaded.LoadedModel) -> np.ndarray:
  """`SENTENCES` as the model's char ids `[batch, time, token_width]` (an EFML model's through its lexicons)."""
  if model.token_ids is None:
    return chars.batch_to_ids([list(s) for s in SENTENCES], max_chars=model.options["char_cnn"].get(
        "max_characters_per_token", chars.MAX_CHARS))
  width = model.token_ids.lead + model.token_ids.max_chars
  out = np.zeros((len(SENTENCES), max(map(len, SENTENCES)), width), np.int32)
  for i, sentence in enumerate(SENTENCES):
    for j, token in enumerate(sentence):
      out[i, j] = model.token_ids(token)
  return out


def max_difference(a: loaded.LoadedModel, b: loaded.LoadedModel) -> float:
  """The largest |a - b| over every layer of both biLMs on `SENTENCES` (0.0: the same outputs)."""
  bilm = make_model(a.options)
  run = jax.jit(lambda params, ids: bilm.apply({"params": params}, ids)["layers"])
  ids = char_ids(a)
  return float(np.max(np.abs(np.asarray(run(a.params, ids)) - np.asarray(run(b.params, ids)))))


def text(spec: str, model: loaded.LoadedModel, diff: float) -> str:
  """The card's markdown for `model` (read from `spec`), converted with layers `diff` apart from it."""
  lstm, cnn = model.options["lstm"], model.options["char_cnn"]
  n_params = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(model.params))
  parts = [p for p, has in (("the LM's softmax", model.softmax), ("a TF-Hub module's learned mix", model.mix),
                            ("its char and word lexicons", model.token_ids)) if has is not None]
  with_parts = "; with " + ", ".join(parts) if parts else ""
  sources = "\n".join(f"| `{os.path.basename(path)}` | `{files.sha256_file(path)}` |"
                      for path in model.files if os.path.isfile(path))
  checked = (f"max |difference| {diff:.3g} over every layer of the biLM on {len(SENTENCES)} fixed sentences "
             f"(`elmo_jax.sources.card.SENTENCES`), the source and this folder each loaded and run through the same "
             "code")
  return f"""---
library_name: elmo_jax
tags: [elmo, jax, flax, safetensors]
---
# ELMo biLM: {spec}

An ELMo bidirectional language model in elmo_jax's own format: `config.json` (the options, the variant, the
format version) and `model.safetensors` (float32; tensor names are the Flax parameter paths joined by "/").

- **Model:** {lstm['n_layers']} LSTM layers of {lstm['dim']} cells projected to {lstm['projection_dim']}, a char
  CNN of {len(cnn['filters'])} filter widths, {n_params:,} biLM parameters{with_parts}.
- **Converted from:** `{spec}` ({model.format}), whose files were:

| file | sha256 |
|---|---|
{sources}

- **Checked:** {checked}.
- **License:** the source's license (elmo_jax does not record it: see where the model came from).

## Loading

```python
from elmo_jax.embedding.embedder import Embedder
emb = Embedder.from_pretrained("THIS_FOLDER")      # or hf://owner/name@revision
```

```bash
elmo-jax embed --model=THIS_FOLDER --input_file=sentences.txt --output_file=out.hdf5
```
"""
