"""Embeds a text file with an ELMo ONNX model and onnxruntime alone (numpy + onnxruntime; no jax, no torch).

    elmo-jax convert --from=small --to=elmo_onnx/ --format=onnx     # once, where elmo_jax is installed
    python examples/onnx_embed.py elmo_onnx/ sentences.txt layers.npz

A folder `convert --format=onnx` wrote: `model.onnx` and `tokenizer.json` (how tokens become char ids: bilm-tf's
UTF-8 bytes, or an ELMoForManyLangs model's own char and word ids). Each line of the input is a sentence, split
on whitespace; the output .npz holds one array per line, named by its 0-based line number: `[n_layers + 1,
n_tokens, 2P]` float32 (layer 0 = the token representation, duplicated). Prints one line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

import numpy as np
import onnxruntime as ort


def token_ids(token: str, tok: dict[str, Any]) -> list[int]:
  """One token's ids, as `tokenizer.json` says (every id shifted by +1 already; 0 = no token)."""
  width, own = tok["max_characters_per_token"], tok["own_char_tokens"]
  if tok["kind"] == "bilm-tf-bytes":
    body = [b + tok["byte_offset"] for b in token.encode("utf-8", "ignore")[:width - 2]]
    lead = []
  else:  # efml-lexicon: code points, a word id first where the model has words
    token = token[:width - 2]
    body = [tok["chars"].get(c, tok["oov_char"]) for c in token]
    lead = [tok["words"].get(token, tok["oov_word"])] if "words" in tok else []
  if token in own:  # the sentence boundaries as tokens: one id of their own
    body = [own[token]]
  ids = [tok["bow"], *body, tok["eow"]]
  return lead + ids + [tok["pad"]] * (width - len(ids))


def batch_ids(sentences: Sequence[Sequence[str]], tok: dict[str, Any]) -> np.ndarray:
  """Sentences -> int32 `[batch, longest, token_width]`, 0 past each sentence (the model's `char_ids`)."""
  width = tok["max_characters_per_token"] + (1 if "words" in tok else 0)
  out = np.zeros((len(sentences), max((len(s) for s in sentences), default=0), width), np.int32)
  for i, sentence in enumerate(sentences):
    for j, token in enumerate(sentence):
      out[i, j] = token_ids(token, tok)
  return out


def load(folder: str) -> tuple[ort.InferenceSession, dict[str, Any]]:
  """The folder's onnxruntime session (CPU) and its tokenizer description."""
  with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
    tok = json.load(f)
  if tok.get("format") != "elmo_jax.tokenizer" or tok.get("version") != 1:
    raise ValueError(f"{folder}/tokenizer.json: not an elmo_jax tokenizer description (version 1)")
  session = ort.InferenceSession(os.path.join(folder, "model.onnx"), providers=["CPUExecutionProvider"])
  return session, tok


def embed(session: ort.InferenceSession, tok: dict[str, Any], sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
  """Each sentence -> `[n_layers + 1, n_tokens, 2P]` float32 (one padded batch)."""
  ids = batch_ids(sentences, tok)
  if ids.shape[1] == 0:  # no tokens at all: nothing to run
    n_layers, dim = session.get_outputs()[0].shape[1], session.get_outputs()[0].shape[3]
    return [np.zeros((n_layers, 0, dim), np.float32) for _ in sentences]
  layers = session.run(["layers"], {"char_ids": ids})[0]
  return [layers[i, :, :len(s)] for i, s in enumerate(sentences)]


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("model", help="a folder with model.onnx and tokenizer.json")
  parser.add_argument("input", help="a UTF-8 text file, one sentence per line")
  parser.add_argument("output", help="the .npz to write")
  parser.add_argument("--batch_size", type=int, default=32)
  args = parser.parse_args(argv)
  session, tok = load(args.model)
  with open(args.input, encoding="utf-8") as f:
    sentences = [line.split() for line in f]
  order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # similar lengths share a batch
  arrays: dict[str, np.ndarray] = {}
  for start in range(0, len(order), args.batch_size):
    chunk = order[start:start + args.batch_size]
    for i, layers in zip(chunk, embed(session, tok, [sentences[i] for i in chunk])):
      arrays[str(i)] = layers
  tmp = args.output + ".partial.npz"  # written whole, then renamed: never half a file under the name
  np.savez(tmp, **arrays)
  os.replace(tmp, args.output)
  print(f"wrote {args.output}: {len(sentences)} sentences, {sum(map(len, sentences))} tokens")
  return 0


if __name__ == "__main__":
  sys.exit(main())
