"""An ONNX model of the biLM that runs with onnxruntime and numpy alone (no jax, flax, torch or tensorflow).

    onnx_export.write("elmo_onnx/", options, params)                  # model.onnx + tokenizer.json
    python examples/onnx_embed.py elmo_onnx/ sentences.txt out.npz   # the runtime side: numpy + onnxruntime

`model.onnx` (built by `onnx_graph.build`, opset 17, checked by `onnx.checker`): one input `char_ids`, int32
`[batch, time, token_width]` exactly as `data.chars.batch_to_ids` returns them (0 = padding; the tokens alone,
without `<S>`/`</S>`: the graph adds them to each sentence, as AllenNLP's `Elmo` and the `Embedder` do); outputs
`layers` `[batch, n_layers + 1, time, 2P]` float32 (layer 0 = [token; token], 0 past each length) and `mask`
`[batch, time]` bool. `tokenizer.json` (`tokenizer`) says how to make the ids from tokens with no library: bilm-tf's
UTF-8 bytes, or an ELMoForManyLangs model's own char and word ids (`chars.LexiconIds`, written out as two maps).
Writing needs the `onnx` package (the `onnx` extra); running needs only onnxruntime.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from elmo_jax.data import chars
from elmo_jax.model import BiLM, BiLMConfig

MODEL_FILE, TOKENIZER_FILE = "model.onnx", "tokenizer.json"
TOKENIZER_FORMAT, VERSION = "elmo_jax.tokenizer", 1
BYTES, LEXICON = "bilm-tf-bytes", "efml-lexicon"


class OnnxExportError(ValueError):
  """A model the exporter cannot write (the onnx package missing); one line."""


def tokenizer(max_chars: int, token_ids: chars.LexiconIds | None = None) -> dict[str, Any]:
  """How tokens become the model's ids, as data (every id already shifted by +1; 0 = no token).

  bilm-tf (`kind` "bilm-tf-bytes"): [bow, the token's UTF-8 bytes + 1 (at most max_chars - 2 bytes), eow, pad...].
  EFML ("efml-lexicon", `chars.LexiconIds`): the token cut to max_chars - 2 code points; with `words`, its word id
  first (`words[token]`, else `oov_word`); then [bow, `chars[c]` per code point (else `oov_char`), eow, pad...].
  Either way a token of `own_char_tokens` (`<S>` / `</S>`, EFML's `<bos>` / `<eos>`) holds its one id between bow
  and eow.
  """
  if token_ids is None:
    return {"format": TOKENIZER_FORMAT, "version": VERSION, "kind": BYTES, "max_characters_per_token": max_chars,
            "bow": chars.BOW_CHAR + 1, "eow": chars.EOW_CHAR + 1, "pad": chars.PAD_CHAR + 1, "byte_offset": 1,
            "own_char_tokens": {chars.BOS_TOKEN: chars.BOS_CHAR + 1, chars.EOS_TOKEN: chars.EOS_CHAR + 1}}
  probe = token_ids("")  # [word id,] bow, eow, pad...
  lead = token_ids.lead
  out = {"format": TOKENIZER_FORMAT, "version": VERSION, "kind": LEXICON, "max_characters_per_token": max_chars,
         "bow": int(probe[lead]), "eow": int(probe[lead + 1]), "pad": token_ids.pad_id,
         "chars": {c: i + 1 for c, i in token_ids.char2id.items()}, "oov_char": token_ids.char2id[chars.EFML_OOV] + 1,
         "own_char_tokens": {t: token_ids.char2id[t] + 1 for t in (chars.EFML_BOS, chars.EFML_EOS)}}
  if token_ids.word2id is not None:
    out.update(words={w: i + 1 for w, i in token_ids.word2id.items()},
               oov_word=token_ids.word2id[chars.EFML_OOV] + 1)
  return out


def write(folder: str, options: dict[str, Any], params: dict[str, Any],
          token_ids: chars.LexiconIds | None = None) -> None:
  """Writes model.onnx and tokenizer.json into `folder` (an existing, empty one: `convert` gives a temp folder
  renamed into place when whole). Raises OnnxExportError without the onnx package."""
  try:
    from elmo_jax.formats import onnx_graph  # pylint: disable=g-import-not-at-top  (onnx: an extra)
  except ImportError as e:
    raise OnnxExportError(f"--format=onnx needs the onnx package: pip install -e '.[onnx]' ({e})") from None
  import jax  # pylint: disable=g-import-not-at-top
  cfg = BiLMConfig.from_options(options)
  boundary = jax.jit(lambda p: BiLM(cfg).apply({"params": p}, method=BiLM.boundary_embeddings))(params)
  model = onnx_graph.build(options, params, np.asarray(boundary, np.float32))
  with open(os.path.join(folder, MODEL_FILE), "wb") as f:
    f.write(model.SerializeToString())
  with open(os.path.join(folder, TOKENIZER_FILE), "w", encoding="utf-8") as f:
    json.dump(tokenizer(cfg.max_characters_per_token, token_ids), f, ensure_ascii=False, indent=1)
