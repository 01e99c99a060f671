"""The biLM's stateless forward as an ONNX graph, built node by node with `onnx.helper` (`onnx_export` writes it).

The graph computes what `BiLM.__call__` does (`model/bilm.py`, `char_cnn.py`, `lstm.py`), op for op:

    char_ids [batch, time, W] int32  ->  Gather (char table, row 0 zeros) -> Conv + ReduceMax + bias + activation
    per filter width -> highway layers (bilm-tf's or AllenNLP's gate) -> [word vector;] -> projection
    -> <S> / </S> placed around each row's tokens (their char-CNN outputs are constants: `boundary`)
    -> per layer, one `Scan` over time running both directions at once ([2, batch, ...] state: bilm-tf's cell
    with projection, cell clip and projection clip, padded steps keeping the state and giving 0), the backward
    direction read reversed within each row's length (GatherElements), skip connections past the first layer
    -> layers [batch, n_layers + 1, time, 2P] (layer 0 = [token; token]), 0 past each row's length; mask [batch, time].

ONNX's own LSTM op has no projection and no cell clip, hence the `Scan`. Opset `OPSET`; the weights are the
graph's initializers (the Scan body reads them from the outer graph).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from elmo_jax.model import BiLMConfig

OPSET = 17
FORGET_BIAS = 1.0  # TF's forget_bias (model/lstm.FORGET_BIAS); AllenNLP's cell holds it in its bias


class Graph:
  """Nodes and initializers of one graph; `op` adds a node and returns its (first) output's name."""

  def __init__(self, prefix: str = ""):
    self.nodes: list[onnx.NodeProto] = []
    self.initializers: list[onnx.TensorProto] = []
    self._prefix, self._n = prefix, 0

  def name(self, hint: str) -> str:
    self._n += 1
    return f"{self._prefix}{hint}_{self._n}"

  def const(self, value: Any, dtype: Any = None, hint: str = "c") -> str:
    array = np.asarray(value, dtype)
    name = self.name(hint)
    self.initializers.append(numpy_helper.from_array(array, name))
    return name

  def op(self, kind: str, *inputs: str, outputs: int | list[str] = 1, **attrs: Any) -> Any:
    names = outputs if isinstance(outputs, list) else [self.name(kind.lower()) for _ in range(outputs)]
    self.nodes.append(helper.make_node(kind, list(inputs), names, **attrs))
    return names[0] if len(names) == 1 else names


def _dot(g: Graph, x: str, w: np.ndarray, b: np.ndarray) -> str:
  """x @ w + b: `_dot` of char_cnn.py and its bias, float32."""
  return g.op("Add", g.op("MatMul", x, g.const(w, np.float32, "w")), g.const(b, np.float32, "b"))


def char_cnn(g: Graph, ids: str, cfg: Any, cnn: dict[str, np.ndarray]) -> str:
  """`CharCNN`: ids [N, token_width] int32 -> [N, P] float32."""
  width = cfg.token_width
  char_ids = ids
  if cfg.n_words:
    word_ids = g.op("Reshape", g.op("Slice", ids, g.const([0], np.int64), g.const([1], np.int64),
                                    g.const([1], np.int64)), g.const([-1], np.int64))
    char_ids = g.op("Slice", ids, g.const([1], np.int64), g.const([width], np.int64), g.const([1], np.int64))
  table = np.concatenate([np.zeros((1, cfg.char_dim), np.float32), cnn["char_embed"]], 0)
  x = g.op("Transpose", g.op("Gather", g.const(table, np.float32, "char_embed"), char_ids), perm=[0, 2, 1])
  act = "Relu" if cfg.activation == "relu" else "Tanh"
  pooled = []
  for i, _ in enumerate(cfg.filters):
    kernel = np.transpose(cnn[f"W_cnn_{i}"], (2, 1, 0))  # [width, C, F] -> Conv's [F, C, width]
    y = g.op("ReduceMax", g.op("Conv", x, g.const(kernel, np.float32, f"W_cnn_{i}")), axes=[2], keepdims=0)
    pooled.append(g.op(act, g.op("Add", y, g.const(cnn[f"b_cnn_{i}"], np.float32, f"b_cnn_{i}"))))
  h = g.op("Concat", *pooled, axis=1)
  one = g.const(1.0, np.float32)
  for i in range(cfg.n_highway):
    p = cnn[f"CNN_high_{i}"]
    gate = g.op("Sigmoid", _dot(g, h, p["W_carry"], p["b_carry"]))
    transform = g.op("Relu", _dot(g, h, p["W_transform"], p["b_transform"]))
    keep, other = (h, transform) if cfg.highway == "allennlp" else (transform, h)
    h = g.op("Add", g.op("Mul", gate, keep), g.op("Mul", g.op("Sub", one, gate), other))
  if cfg.n_words:
    words = np.concatenate([np.zeros((1, cfg.word_dim), np.float32), cnn["word_embed"]], 0)
    h = g.op("Concat", g.op("Gather", g.const(words, np.float32, "word_embed"), word_ids), h, axis=1)
  if cfg.projection_dim != sum(n for _, n in cfg.filters) or cfg.n_words:
    h = _dot(g, h, cnn["CNN_proj"]["W_proj"], cnn["CNN_proj"]["b_proj"])
  return h


def _cell_body(cfg: Any, w: str, bias: str, w_p: str) -> onnx.GraphProto:
  """One time step of both directions (`lstm_step.step_fn`, inference): (c [2, B, H], h [2, B, P], x_t [2, B, I],
  keep_t [1, B, 1] bool) -> (c, h, y_t [2, B, P])."""
  g = Graph("step_")
  c, h, x, keep = "c_in", "h_in", "x_t", "keep_t"
  gates = g.op("Add", g.op("MatMul", g.op("Concat", x, h, axis=-1), w), bias)
  i, j, f, o = g.op("Split", gates, axis=-1, outputs=4)
  si, tj, sf, so = g.op("Sigmoid", i), g.op("Tanh", j), g.op("Sigmoid", f), g.op("Sigmoid", o)
  c_new = g.op("Add", g.op("Mul", sf, c), g.op("Mul", si, tj))
  if cfg.cell_clip:
    c_new = g.op("Clip", c_new, g.const(-cfg.cell_clip, np.float32), g.const(cfg.cell_clip, np.float32))
  h_new = g.op("MatMul", g.op("Mul", so, g.op("Tanh", c_new)), w_p)
  if cfg.proj_clip:
    h_new = g.op("Clip", h_new, g.const(-cfg.proj_clip, np.float32), g.const(cfg.proj_clip, np.float32))
  g.op("Where", keep, c_new, c, outputs=["c_out"])
  g.op("Where", keep, h_new, h, outputs=["h_out"])
  g.op("Where", keep, h_new, g.const(0.0, np.float32), outputs=["y_t"])
  f32, untyped = TensorProto.FLOAT, None
  inputs = [helper.make_tensor_value_info(n, f32, untyped) for n in (c, h, x)]
  inputs.append(helper.make_tensor_value_info(keep, TensorProto.BOOL, untyped))
  outputs = [helper.make_tensor_value_info(n, f32, untyped) for n in ("c_out", "h_out", "y_t")]
  return helper.make_graph(g.nodes, "lstm_step", inputs, outputs, initializer=g.initializers)


def lstm_layer(g: Graph, cfg: Any, x: str, keep: str, zeros: tuple[str, str], k: int,
               lstm: dict[str, Any]) -> str:
  """Layer k of both stacks: x [T, 2, B, I] (each direction in its reading order), keep [T, 1, B, 1] ->
  outputs [T, 2, B, P]."""
  cells = [lstm[f"{d}_layer_{k}"] for d in ("forward", "backward")]
  forget = np.zeros(4 * cfg.lstm_dim, np.float32)
  forget[2 * cfg.lstm_dim:3 * cfg.lstm_dim] = FORGET_BIAS if cfg.implicit_forget_bias else 0.0
  w = g.const(np.stack([c["W_0"] for c in cells]), np.float32, f"W_0_{k}")  # [2, I + P, 4H]
  bias = g.const(np.stack([c["B"] + forget for c in cells])[:, None], np.float32, f"B_{k}")  # [2, 1, 4H]
  w_p = g.const(np.stack([c["W_P_0"] for c in cells]), np.float32, f"W_P_0_{k}")  # [2, H, P]
  body = _cell_body(cfg, w, bias, w_p)
  _, _, y = g.op("Scan", *zeros, x, keep, outputs=3, body=body, num_scan_inputs=2)
  return y


def _reverse(g: Graph, x: str, index: str) -> str:
  """`reverse_within_length` of x [B, T, D] with its index [B, T, 1] (int64)."""
  return g.op("GatherElements", x, g.op("Expand", index, g.op("Shape", x)), axis=1)


def build(options: dict[str, Any], params: dict[str, Any], boundary: np.ndarray) -> onnx.ModelProto:
  """The model of validated `options` and its `params`; `boundary` [2, P]: the char CNN's `<S>` and `</S>`."""
  cfg = BiLMConfig.from_options(options)
  g = Graph()
  i64 = lambda v: g.const(v, np.int64)  # noqa: E731
  ids = "char_ids"
  shape = g.op("Shape", ids)
  batch, time = g.op("Slice", shape, i64([0]), i64([1])), g.op("Slice", shape, i64([1]), i64([2]))
  mask = g.op("Cast", g.op("ReduceMax", g.op("Cast", g.op("Greater", ids, g.const(0, np.int32)), to=TensorProto.INT32),
                           axes=[2], keepdims=0), to=TensorProto.BOOL)  # [B, T]
  tokens = char_cnn(g, g.op("Reshape", ids, i64([-1, cfg.token_width])), cfg, params["char_cnn"])
  emb = g.op("Reshape", tokens, g.op("Concat", batch, time, i64([cfg.projection_dim]), axis=0))
  emb = g.op("Where", g.op("Unsqueeze", mask, i64([2])), emb, g.const(0.0, np.float32))
  lengths = g.op("ReduceSum", g.op("Cast", mask, to=TensorProto.INT64), i64([1]), keepdims=0)  # [B]
  # <S> at 0, the tokens, </S> at length + 1; an empty row stays empty (BiLM.__call__'s add_bos_eos)
  steps = g.op("Add", time, i64([2]))
  t = g.op("Range", i64(0), g.op("Squeeze", steps, i64([0])), i64(1))  # [T + 2]
  t3, len3 = g.op("Reshape", t, i64([1, -1, 1])), g.op("Reshape", lengths, i64([-1, 1, 1]))
  shifted = g.op("Pad", emb, i64([0, 1, 0, 0, 1, 0]))
  bos, eos = (g.const(boundary[k], np.float32, n) for k, n in ((0, "bos"), (1, "eos")))
  emb = g.op("Where", g.op("Equal", t3, i64(0)), bos,
             g.op("Where", g.op("Equal", t3, g.op("Add", len3, i64(1))), eos, shifted))
  len2 = g.op("Where", g.op("Greater", len3, i64(0)), g.op("Add", len3, i64(2)), i64(0))  # [B, 1, 1]
  keep = g.op("Less", t3, len2)  # [B, T + 2, 1]
  emb = g.op("Where", keep, emb, g.const(0.0, np.float32))
  index = g.op("Where", keep, g.op("Sub", g.op("Sub", len2, i64(1)), t3), g.op("Expand", t3, g.op("Shape", keep)))
  x = g.op("Concat", g.op("Unsqueeze", emb, i64([0])), g.op("Unsqueeze", _reverse(g, emb, index), i64([0])), axis=0)
  x = g.op("Transpose", x, perm=[2, 0, 1, 3])  # [T + 2, 2, B, P]
  keep_t = g.op("Transpose", g.op("Unsqueeze", keep, i64([0])), perm=[2, 0, 1, 3])  # [T + 2, 1, B, 1]
  zeros = tuple(g.op("ConstantOfShape", g.op("Concat", i64([2]), batch, i64([dim]), axis=0),
                     value=numpy_helper.from_array(np.zeros(1, np.float32)))
                for dim in (cfg.lstm_dim, cfg.projection_dim))
  layers = [g.op("Concat", emb, emb, axis=-1)]
  for k in range(cfg.n_layers):
    out = lstm_layer(g, cfg, x, keep_t, zeros, k, params["lstm"])
    if cfg.use_skip_connections and k > 0:
      out = g.op("Add", out, x)  # both 0 on padded steps, as BiLSTMStack's masked sum
    x = out
    both = g.op("Transpose", out, perm=[1, 2, 0, 3])  # [2, B, T + 2, P]
    fwd, bwd = (g.op("Gather", both, i64(d), axis=0) for d in (0, 1))
    layers.append(g.op("Concat", fwd, _reverse(g, bwd, index), axis=-1))
  stacked = g.op("Concat", *[g.op("Unsqueeze", y, i64([1])) for y in layers], axis=1)  # [B, L + 1, T + 2, 2P]
  inner = g.op("Slice", stacked, i64([1]), i64([-1]), i64([2]))
  out_mask = g.op("Less", g.op("Reshape", g.op("Range", i64(0), g.op("Squeeze", time, i64([0])), i64(1)),
                               i64([1, -1])), g.op("Reshape", lengths, i64([-1, 1])), outputs=["mask"])
  g.op("Where", g.op("Reshape", out_mask, g.op("Concat", batch, i64([1]), time, i64([1]), axis=0)), inner,
       g.const(0.0, np.float32), outputs=["layers"])
  graph = helper.make_graph(
      g.nodes, "elmo_bilm",
      [helper.make_tensor_value_info(ids, TensorProto.INT32, ["batch", "time", cfg.token_width])],
      [helper.make_tensor_value_info("layers", TensorProto.FLOAT, ["batch", cfg.n_layers + 1, "time", cfg.output_dim]),
       helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "time"])],
      initializer=g.initializers)
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="elmo_jax")
  onnx.checker.check_model(model, full_check=True)
  return model
