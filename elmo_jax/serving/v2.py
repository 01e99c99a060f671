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

import json
import struct
from typing import Any, Sequence

import numpy as np

from elmo_jax.embedding.args import sentence_means
from elmo_jax.runtime import json_bounded

INPUT = "text"
OUTPUTS = ("layers", "top", "average", "sentence_vector", "lengths")
HEADER_LENGTH = "Inference-Header-Content-Length"


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


def _shape(spec: dict[str, Any]) -> list[int]:
  shape = spec.get("shape")
  if (not isinstance(shape, list) or not 1 <= len(shape) <= 2
      or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
    raise RequestError(f"input '{INPUT}': shape must be [n] (a sentence per element) or [n, t] (a sentence's "
                       f"tokens per row), got {shape!r}"[:300])
  return shape


def _input_strings(spec: dict[str, Any], binary: memoryview, at: int) -> tuple[list[str], list[int], int]:
  """One input's elements as str, its shape, and the binary offset past its data."""
  if spec.get("name") != INPUT:
    raise RequestError(f"unknown input {spec.get('name')!r}: the model's one input is '{INPUT}' (BYTES)"[:300])
  if spec.get("datatype") != "BYTES":
    raise RequestError(f"input '{INPUT}' has datatype BYTES (tokens as UTF-8), got {spec.get('datatype')!r}"[:300])
  shape = _shape(spec)
  count = int(np.prod(shape))
  size = (spec.get("parameters") or {}).get("binary_data_size")
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


def parse_infer(body: bytes, header_length: str | None) -> tuple[list[list[str]], dict[str, bool], Any]:
  """An inference request -> (sentences as tokens, {output name: binary?} in output order, the request id)."""
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
  strings, shape, _ = _input_strings(inputs[0], binary, 0)
  if len(shape) == 1:
    sentences = [s.split() for s in strings]
  else:
    sentences = [[t for t in strings[i * shape[1]:(i + 1) * shape[1]] if t] for i in range(shape[0])]
  return sentences, _outputs(header), header.get("id")


def _outputs(header: dict[str, Any]) -> dict[str, bool]:
  """The outputs asked for (all, when none is named, as the protocol says), each with whether it goes binary."""
  params = header.get("parameters") or {}
  binary_default = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
  asked = header.get("outputs")
  if asked is None:
    return {name: binary_default for name in OUTPUTS}
  if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
    raise RequestError("'outputs' must be a list of objects with a 'name'")
  out = {}
  for o in asked:
    if o.get("name") not in OUTPUTS:
      raise RequestError(f"unknown output {o.get('name')!r}; the model's outputs: {', '.join(OUTPUTS)}"[:300])
    out[o["name"]] = bool((o.get("parameters") or {}).get("binary_data", binary_default))
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
    out["layers"], out["top"] = padded, padded[:, -1]
    out["average"] = padded.mean(axis=1) if n else np.zeros((0, 0, dim), np.float32)
  if "sentence_vector" in names:
    out["sentence_vector"] = sentence_means(per_sentence, layer, n_layers, dim) if n else np.zeros((0, 0), np.float32)
  out["lengths"] = lengths
  return {name: np.ascontiguousarray(out[name], np.int32 if name == "lengths" else np.float32) for name in names}


def response(model_name: str, request_id: Any, arrays: dict[str, np.ndarray],
             binary: dict[str, bool]) -> tuple[bytes, dict[str, str]]:
  """The response body and its headers (JSON, or JSON + the binary outputs with `HEADER_LENGTH`)."""
  entries, blobs = [], []
  for name, array in arrays.items():
    entry = {"name": name, "datatype": "INT32" if array.dtype == np.int32 else "FP32", "shape": list(array.shape)}
    if binary[name]:
      data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
      entry["parameters"] = {"binary_data_size": len(data)}
      blobs.append(data)
    else:
      entry["data"] = array.ravel().tolist()
    entries.append(entry)
  head = {"model_name": model_name, "model_version": "1", "outputs": entries}
  if request_id is not None:
    head["id"] = request_id
  text = json.dumps(head, separators=(",", ":")).encode()
  if not blobs:
    return text, {"content-type": "application/json"}
  return b"".join([text, *blobs]), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(text))}

