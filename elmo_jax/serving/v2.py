"""The Open Inference Protocol (KServe v2: what Triton, KServe and MLServer speak) for ELMo: its inference
request read, its response written, in the JSON form and in the binary tensor data extension.

One input, `text`, datatype BYTES: shape `[n]` (each element one sentence, split at whitespace) or `[n, t]` (each
row one sentence's tokens; empty elements are padding and dropped). Outputs by name, FP32 unless said:

    layers           [n, n_layers + 1, time, 2P]   every layer (time: the longest sentence; zeros past a length)
    top, average     [n, time, 2P]                 the top layer, the mean of the layers
    sentence_vector  [n, 2P]                       the mean over a sentence's tokens of the server's --layer
    lengths          [n] INT32                     tokens per sentence

Binary extension: a request whose `Inference-Header-Content-Length` header is k has k bytes of JSON, then the
inputs' raw data in input order (`"parameters": {"binary_data_size": b}` on each such input; a BYTES element is a
4-byte little-endian length and its bytes). An output asked for with `"parameters": {"binary_data": true}` (or all
outputs, with the request parameter `binary_data_output`) comes back the same way: its JSON entry carries
`binary_data_size`, its little-endian bytes follow the JSON in output order.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import struct
from typing import Any, Callable, Sequence

import numpy as np

from elmo_jax.embedding.args import sentence_means
from elmo_jax.runtime import json_bounded

INPUT = "text"
OUTPUTS = ("layers", "top", "average", "sentence_vector", "lengths")
HEADER_LENGTH = "Inference-Header-Content-Length"
OPENAI_MAX_INPUTS = 2048  # OpenAI's own limit of inputs per request
JSON_FLOAT_BYTES = 25  # the longest `repr` of a float32 as a double, and its comma: -1.1754943508222875e-38,
_JSON_CHUNK = 1 << 16  # elements formatted at once (no Python list of a whole answer)


@dataclasses.dataclass(frozen=True)
class Limits:
  """What one request may cost, known before any work: sentences, tokens per sentence and in all, and the
  answer's bytes (each checked in `parse_infer` / `openai_api.parse`, a 413 naming the limit).

  `derived` makes them from the server's flags: a sentence at most `--max_tokens`; a request at most 16 device
  batches of tokens (`--max_batch_tokens`: what a timeout can wait for) and 4 batches of sentences (an empty
  sentence costs an answer row); an answer at most 16 times `--max_body_bytes` (64 MiB at least). `n_layers`,
  `dim`: the model's (an answer's size is known from the sentences' lengths).
  """
  max_tokens: int
  max_sentences: int
  max_total_tokens: int
  max_answer_bytes: int
  n_layers: int
  dim: int

  @classmethod
  def derived(cls, max_body_bytes: int, max_tokens: int, max_batch_tokens: int, n_layers: int,
              dim: int) -> "Limits":
    return cls(max_tokens=max_tokens, max_sentences=max(OPENAI_MAX_INPUTS, 4 * max_batch_tokens),
               max_total_tokens=max(max_tokens, 16 * max_batch_tokens),
               max_answer_bytes=max(64 << 20, 16 * max_body_bytes), n_layers=n_layers, dim=dim)

  def check_sentences(self, sentences: Sequence[Sequence[str]]) -> None:
    """413 for a sentence over `max_tokens` or tokens in all over `max_total_tokens`."""
    total = 0
    for i, s in enumerate(sentences):
      total += len(s)
      if len(s) > self.max_tokens:
        raise RequestError(f"sentence {i} has {len(s)} tokens; this server takes at most {self.max_tokens} "
                           "(--max_tokens)", 413)
    if total > self.max_total_tokens:
      raise RequestError(f"the request has {total} tokens; this server takes at most {self.max_total_tokens} in "
                         "one request (16 x --max_batch_tokens); split it", 413)

  def answer_bytes(self, lengths: Sequence[int], outputs: dict[str, bool]) -> int:
    """An upper bound of the answer's bytes: every element of each output, at `JSON_FLOAT_BYTES` in JSON."""
    n = len(lengths)
    time = max(lengths, default=0)
    elements = {"layers": n * self.n_layers * time * self.dim, "top": n * time * self.dim,
                "average": n * time * self.dim, "sentence_vector": n * self.dim, "lengths": n}
    return sum(elements[name] * (4 if binary else JSON_FLOAT_BYTES) for name, binary in outputs.items())

  def check_answer(self, lengths: Sequence[int], outputs: dict[str, bool]) -> None:
    size = self.answer_bytes(lengths, outputs)
    if size > self.max_answer_bytes:
      raise RequestError(f"the answer would take up to {size:,} bytes ({len(lengths)} sentences padded to "
                         f"{max(lengths, default=0)} tokens); this server writes at most {self.max_answer_bytes:,} "
                         "(16 x --max_body_bytes): ask for fewer sentences, sentence_vector, or binary_data", 413)


class RequestError(ValueError):
  """A request the server cannot answer: HTTP `status` (400, 404, 413) and a one-line message."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


def json_object(body: bytes, what: str = "request") -> dict[str, Any]:
  """The body as a JSON object; 400 for bytes that are not UTF-8, not JSON or not an object."""
  try:
    text = body.decode("utf-8")
  except UnicodeDecodeError as e:
    raise RequestError(f"the {what} is not UTF-8 (byte {e.start})") from None
  try:
    value = json_bounded.loads(text, f"the {what}", max_bytes=len(text))
  except json_bounded.JSONLimitError as e:
    raise RequestError(str(e)) from None
  except json.JSONDecodeError as e:
    raise RequestError(f"the {what} is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
  if not isinstance(value, dict):
    raise RequestError(f"the {what} must be a JSON object, got {type(value).__name__}")
  return value


def metadata(name: str, n_layers: int, dim: int) -> dict[str, Any]:
  """`GET /v2/models/{name}`: the model's inputs and outputs with datatypes and shapes (-1: variable)."""
  shapes = {"layers": [-1, n_layers, -1, dim], "top": [-1, -1, dim], "average": [-1, -1, dim],
            "sentence_vector": [-1, dim], "lengths": [-1]}
  return {"name": name, "versions": ["1"], "platform": "elmo_jax",
          "inputs": [{"name": INPUT, "datatype": "BYTES", "shape": [-1]}],
          "outputs": [{"name": k, "datatype": "INT32" if k == "lengths" else "FP32", "shape": shapes[k]}
                      for k in OUTPUTS]}


def _bytes_elements(raw: bytes, count: int) -> list[bytes]:
  """The binary form of a BYTES tensor (4-byte little-endian length, then the bytes), `count` elements."""
  out, at = [], 0
  for _ in range(count):
    if at + 4 > len(raw):
      raise RequestError(f"input '{INPUT}': its binary data ends inside element {len(out)} of {count}")
    (size,) = struct.unpack_from("<I", raw, at)
    if at + 4 + size > len(raw):
      raise RequestError(f"input '{INPUT}': element {len(out)} claims {size} bytes past the data's end")
    out.append(raw[at + 4:at + 4 + size])
    at += 4 + size
  if at != len(raw):
    raise RequestError(f"input '{INPUT}': {len(raw) - at} bytes of binary data past its {count} elements")
  return out


def _flat_strings(data: Any) -> list[str]:
  """The JSON form's `data` (nested lists of strings, row-major) flattened."""
  if isinstance(data, str):
    return [data]
  if not isinstance(data, list):
    raise RequestError(f"input '{INPUT}': data must be strings (datatype BYTES), got {type(data).__name__}")
  return [s for item in data for s in _flat_strings(item)]


def _shape(spec: dict[str, Any], limits: Limits) -> list[int]:
  """The input's shape, each dimension within `limits` (a zero beside a huge one included) before any work."""
  shape = spec.get("shape")
  if (not isinstance(shape, list) or not 1 <= len(shape) <= 2
      or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
    raise RequestError(f"input '{INPUT}': shape must be [n] (a sentence per element) or [n, t] (a sentence's "
                       f"tokens per row), got {shape!r}"[:300])
  if shape[0] > limits.max_sentences:
    raise RequestError(f"input '{INPUT}': shape {shape} has {shape[0]} sentences; this server takes at most "
                       f"{limits.max_sentences} in one request (4 x --max_batch_tokens)"[:300], 413)
  if len(shape) == 2 and shape[1] > limits.max_tokens:
    raise RequestError(f"input '{INPUT}': shape {shape} has rows of {shape[1]} tokens; this server takes at most "
                       f"{limits.max_tokens} (--max_tokens)"[:300], 413)
  if shape[0] == 0:
    raise RequestError(f"input '{INPUT}': shape {shape} holds no sentence; send at least one")
  return shape


def _object(value: Any, what: str) -> dict[str, Any]:
  """`value` (absent: {}) as a JSON object, else 400 naming `what`."""
  if value is None:
    return {}
  if not isinstance(value, dict):
    raise RequestError(f"{what} must be a JSON object, got {type(value).__name__}")
  return value


def _input_strings(spec: dict[str, Any], binary: memoryview, at: int, limits: Limits
                   ) -> tuple[list[str], list[int], int]:
  """One input's elements as str, its shape, and the binary offset past its data."""
  if spec.get("name") != INPUT:
    raise RequestError(f"unknown input {spec.get('name')!r}: the model's one input is '{INPUT}' (BYTES)"[:300])
  if spec.get("datatype") != "BYTES":
    raise RequestError(f"input '{INPUT}' has datatype BYTES (tokens as UTF-8), got {spec.get('datatype')!r}"[:300])
  shape = _shape(spec, limits)
  count = shape[0] * (shape[1] if len(shape) == 2 else 1)
  size = _object(spec.get("parameters"), f"input '{INPUT}': parameters").get("binary_data_size")
  if size is not None:
    if not isinstance(size, int) or size < 0 or at + size > len(binary):
      raise RequestError(f"input '{INPUT}': binary_data_size {size!r} past the {len(binary) - at} bytes left"[:300])
    try:
      strings = [b.decode("utf-8") for b in _bytes_elements(bytes(binary[at:at + size]), count)]
    except UnicodeDecodeError as e:
      raise RequestError(f"input '{INPUT}': an element is not UTF-8 (byte {e.start})") from None
    return strings, shape, at + size
  strings = _flat_strings(spec.get("data"))
  if len(strings) != count:
    raise RequestError(f"input '{INPUT}': shape {shape} holds {count} elements, data has {len(strings)}")
  return strings, shape, at


def parse_infer(body: bytes, header_length: str | None, limits: Limits,
                tokenize: Callable[[str], list[str]] = str.split) -> tuple[list[list[str]], dict[str, bool], Any]:
  """An inference request -> (sentences as tokens, {output name: binary?} in output order, the request id);
  every dimension, the tokens and the answer's size checked against `limits` (400 / 413) before any work. A
  sentence of shape `[n]` is `tokenize`d (the server's `--tokenize`, as `/v1/embeddings`); `[n, t]` rows are
  tokens already."""
  if header_length is not None:
    try:
      n = int(header_length)
    except ValueError:
      n = -1
    if not 0 <= n <= len(body):
      raise RequestError(f"{HEADER_LENGTH}: {header_length!r} is not a length within the body's "
                         f"{len(body)} bytes"[:300])
    header, binary = json_object(body[:n]), memoryview(body)[n:]
  else:
    header, binary = json_object(body), memoryview(b"")
  inputs = header.get("inputs")
  if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
    raise RequestError(f"'inputs' must be a list of one input, '{INPUT}' (BYTES)")
  outputs = _outputs(header)
  strings, shape, _ = _input_strings(inputs[0], binary, 0, limits)
  if len(shape) == 1:
    sentences = [tokenize(s) for s in strings]
  else:
    sentences = [[t for t in strings[i * shape[1]:(i + 1) * shape[1]] if t] for i in range(shape[0])]
  limits.check_sentences(sentences)
  limits.check_answer([len(s) for s in sentences], outputs)
  return sentences, outputs, header.get("id")


def _outputs(header: dict[str, Any]) -> dict[str, bool]:
  """The outputs asked for (all, when none is named, as the protocol says), each with whether it goes binary."""
  params = _object(header.get("parameters"), "the request's parameters")
  binary_default = bool(params.get("binary_data_output", False))
  asked = header.get("outputs")
  if asked is None:
    return {name: binary_default for name in OUTPUTS}
  if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
    raise RequestError("'outputs' must be a list of objects with a 'name'")
  out = {}
  for o in asked:
    if o.get("name") not in OUTPUTS:
      raise RequestError(f"unknown output {o.get('name')!r}; the model's outputs: {', '.join(OUTPUTS)}"[:300])
    parameters = _object(o.get("parameters"), f"output {o['name']!r}: parameters")
    out[o["name"]] = bool(parameters.get("binary_data", binary_default))
  return out


def output_arrays(per_sentence: Sequence[np.ndarray], names: Sequence[str], layer: Any) -> dict[str, np.ndarray]:
  """Each sentence's layers `[n_layers + 1, n_tokens, 2P]` -> the named outputs (padded to the longest)."""
  n = len(per_sentence)
  n_layers, dim = (per_sentence[0].shape[0], per_sentence[0].shape[2]) if n else (0, 0)
  lengths = np.array([x.shape[1] for x in per_sentence], np.int32)
  time = int(lengths.max()) if n else 0
  out: dict[str, np.ndarray] = {}
  if {"layers", "top", "average"} & set(names):
    padded = np.zeros((n, n_layers, time, dim), np.float32)
    for i, x in enumerate(per_sentence):
      padded[i, :, :x.shape[1]] = x
    out["layers"] = padded
    out["top"] = padded[:, -1]
    out["average"] = padded.mean(axis=1) if n else np.zeros((0, 0, dim), np.float32)
  if "sentence_vector" in names:
    out["sentence_vector"] = sentence_means(per_sentence, layer, n_layers, dim) if n else np.zeros((0, 0), np.float32)
  out["lengths"] = lengths
  return {name: np.ascontiguousarray(out[name], np.int32 if name == "lengths" else np.float32) for name in names}


def _json_floats(array: np.ndarray) -> bytes:
  """The JSON array `json.dumps(array.ravel().tolist())` gives (compact), made `_JSON_CHUNK` elements at a
  time: never one Python list of a whole answer."""
  flat = array.ravel()
  out = [b"["]
  for at in range(0, len(flat), _JSON_CHUNK):
    out.append((b"," if at else b"") + json.dumps(flat[at:at + _JSON_CHUNK].tolist(),
                                                  separators=(",", ":"))[1:-1].encode())
  out.append(b"]")
  return b"".join(out)


def _dumps(head: dict[str, Any], data: list[np.ndarray | None]) -> bytes:
  """`head` as compact JSON, output k's entry with `"data"`: `data[k]` (None: an entry without data)."""
  compact = functools.partial(json.dumps, separators=(",", ":"))
  entries = []
  for entry, values in zip(head["outputs"], data):
    text = compact(entry).encode()
    if values is not None:  # "data" goes in before the entry's closing brace
      text = text[:-1] + b',"data":' + _json_floats(values) + b"}"
    entries.append(text)
  rest = compact({key: value for key, value in head.items() if key != "outputs"}).encode()
  separator = b"," if len(rest) > 2 else b""  # none after "{" when `head` holds only the outputs
  return rest[:-1] + separator + b'"outputs":[' + b",".join(entries) + b"]}"


def response(model_name: str, request_id: Any, arrays: dict[str, np.ndarray],
             binary: dict[str, bool]) -> tuple[bytes, dict[str, str]]:
  """The response body and its headers (JSON, or JSON + the binary outputs with `HEADER_LENGTH`)."""
  entries, blobs, data = [], [], []
  for name, array in arrays.items():
    entry = {"name": name, "datatype": "INT32" if array.dtype == np.int32 else "FP32", "shape": list(array.shape)}
    if binary[name]:
      raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
      entry["parameters"] = {"binary_data_size": len(raw)}
      blobs.append(raw)
    data.append(None if binary[name] else array)
    entries.append(entry)
  head = {"model_name": model_name, "model_version": "1", "outputs": entries}
  if request_id is not None:
    head["id"] = request_id
  text = _dumps(head, data)
  if not blobs:
    return text, {"content-type": "application/json"}
  return b"".join([text, *blobs]), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(text))}

