"""An OpenAI-compatible `POST /v1/embeddings` for ELMo: one vector per input, so every client written for that
API can use it.

Request: `{"model": NAME, "input": "text" | ["text", ...], "encoding_format": "float" | "base64"}` (and the
optional `dimensions`, which must be the model's 2P, and `user`, ignored). Each input is tokenized as the server
is told (`--tokenize`: the trainer's Moses tokenizer; else split at whitespace, as the embed command reads
lines); its vector is the mean over its tokens of the server's `--layer` output (`Embedder.sentence_vectors`; no
tokens: zeros). `base64`: the float32 vector's little-endian bytes, base64-encoded (what the `openai` client
asks for by default and decodes). `usage` counts ELMo tokens.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Callable, Sequence

import numpy as np

from elmo_jax.serving.v2 import OPENAI_MAX_INPUTS as MAX_INPUTS
from elmo_jax.serving.v2 import Limits, RequestError, json_object


def error_body(message: str, status: int) -> bytes:
  """OpenAI's error object (its clients read `error.message`), one line."""
  kind = {404: "not_found_error", 413: "invalid_request_error", 503: "server_error", 504: "timeout"}.get(
      status, "invalid_request_error")
  code = "model_not_found" if status == 404 else None
  return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def parse(body: bytes, model_name: str, dim: int, tokenize: Callable[[str], list[str]], limits: Limits
          ) -> tuple[list[list[str]], str]:
  """A request -> (each input's tokens, encoding_format); `RequestError` (400, 404 for another model, 413 past
  `limits`: a sentence's tokens or the request's)."""
  request = json_object(body)
  model = request.get("model")
  if not isinstance(model, str):
    raise RequestError("'model' is required: a string, the served model's name")
  if model != model_name:
    raise RequestError(f"model {model!r} is not served here; this server serves {model_name!r}"[:300], 404)
  texts = request.get("input")
  if isinstance(texts, str):
    texts = [texts]
  if not isinstance(texts, list) or not texts:
    raise RequestError("'input' must be a string or a non-empty list of strings")
  if len(texts) > MAX_INPUTS:
    raise RequestError(f"'input' has {len(texts)} strings; at most {MAX_INPUTS} per request")
  for i, text in enumerate(texts):
    if not isinstance(text, str):
      raise RequestError(f"input {i} is a {type(text).__name__}: ELMo reads text (its own char ids), not token ids")
  fmt = request.get("encoding_format", "float")
  if fmt not in ("float", "base64"):
    raise RequestError(f"encoding_format must be 'float' or 'base64', got {fmt!r}"[:300])
  dims = request.get("dimensions")
  if dims is not None and dims != dim:
    raise RequestError(f"dimensions: this model's vectors have {dim}, got {dims!r} (ELMo cannot shorten them)"[:300])
  sentences = [tokenize(t) for t in texts]
  limits.check_sentences(sentences)
  return sentences, fmt


def response(vectors: np.ndarray, sentences: Sequence[Sequence[str]], fmt: str, model_name: str) -> bytes:
  """`vectors` `[n, 2P]` as the API's list of embedding objects, with `usage`."""
  vectors = np.ascontiguousarray(vectors, "<f4")
  data: list[dict[str, Any]] = []
  for i, v in enumerate(vectors):
    embedding = base64.b64encode(v.tobytes()).decode("ascii") if fmt == "base64" else v.tolist()
    data.append({"object": "embedding", "index": i, "embedding": embedding})
  tokens = sum(len(s) for s in sentences)
  return json.dumps({"object": "list", "data": data, "model": model_name,
                     "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}, separators=(",", ":")).encode()
