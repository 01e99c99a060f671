"""A slow, pure-numpy reference of bilm-tf's inference graph, written from the TF1 / bilm-tf semantics.

It reads weights by their *hdf5 dataset names* (the layout of bilm-tf's `dump_weights`), not Flax params,
so that comparing it with `BiLM` also checks the weight mapping. Everything is a plain per-sentence,
per-time-step loop in float64:

- chars: table row 0 is zero (id 0 = no token), the stored `char_embed` holds rows 1..261.
- char CNN: VALID 1-D convolution per filter, max over positions, + bias, activation (relu/tanh).
- highway: g = sigmoid(x W_carry + b_carry); out = g * relu(x W_transform + b_transform) + (1 - g) * x.
- projection to P (only when P differs from the number of filters).
- each sentence is wrapped in <S> ... </S>.
- TF1 LSTMCell(num_proj, cell_clip, proj_clip, forget_bias=1.0): gates = concat([x, h_prev]) @ W_0 + B,
  split i, j, f, o; c = sig(f + 1) * c + sig(i) * tanh(j); clip c; m = sig(o) * tanh(c); h = m @ W_P_0; clip h.
- layers > 0 wrapped in ResidualWrapper (output = cell output + cell input) when use_skip_connections.
- the backward LM (RNN_1) reads the sentence reversed within its length (tf.reverse_sequence).
- outputs are zero past each sentence's length; an empty sentence gives zeros and leaves its state alone.
"""
from __future__ import annotations

import numpy as np

from elmo_jax.data import chars


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


class Reference:
  def __init__(self, weights: dict[str, np.ndarray], options: dict):
    self.w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    self.cnn = options["char_cnn"]
    self.lstm = options["lstm"]
    self.clip_hits = {"cell": 0, "proj": 0}

  # --- token encoder --------------------------------------------------------------------------------------
  def token_embedding(self, ids: np.ndarray) -> np.ndarray:
    """ids [50] (shifted, as batch_to_ids gives them) -> [P]."""
    table = np.concatenate([np.zeros((1, self.w["char_embed"].shape[1])), self.w["char_embed"]], 0)
    x = table[ids]  # [50, dim]
    act = (lambda v: np.maximum(v, 0.0)) if self.cnn.get("activation", "relu") == "relu" else np.tanh
    pooled = []
    for i, (width, num) in enumerate(self.cnn["filters"]):
      kernel = self.w[f"CNN/W_cnn_{i}"][0]  # [width, dim, num]
      conv = np.stack([sum(x[p + k] @ kernel[k] for k in range(width)) for p in range(len(ids) - width + 1)])
      pooled.append(act(conv.max(axis=0) + self.w[f"CNN/b_cnn_{i}"]))
    h = np.concatenate(pooled)
    for i in range(self.cnn.get("n_highway") or 0):
      g = _sigmoid(h @ self.w[f"CNN_high_{i}/W_carry"] + self.w[f"CNN_high_{i}/b_carry"])
      t = np.maximum(h @ self.w[f"CNN_high_{i}/W_transform"] + self.w[f"CNN_high_{i}/b_transform"], 0.0)
      h = g * t + (1.0 - g) * h
    if "CNN_proj/W_proj" in self.w and self.lstm["projection_dim"] != h.shape[0]:
      h = h @ self.w["CNN_proj/W_proj"] + self.w["CNN_proj/b_proj"]
    return h

  # --- LSTM -----------------------------------------------------------------------------------------------
  def _cell(self, d, k, x, c, h):
    name = f"RNN_{d}/RNN/MultiRNNCell/Cell{k}/LSTMCell/"
    z = np.concatenate([x, h]) @ self.w[name + "W_0"] + self.w[name + "B"]
    i, j, f, o = np.split(z, 4)
    c = _sigmoid(f + 1.0) * c + _sigmoid(i) * np.tanh(j)
    cc = self.lstm.get("cell_clip")
    if cc:
      self.clip_hits["cell"] += int(np.sum(np.abs(c) > cc))
      c = np.clip(c, -cc, cc)
    m = _sigmoid(o) * np.tanh(c)
    h = m @ self.w[name + "W_P_0"]
    pc = self.lstm.get("proj_clip")
    if pc:
      self.clip_hits["proj"] += int(np.sum(np.abs(h) > pc))
      h = np.clip(h, -pc, pc)
    return c, h

  def sentence(self, tokens: list[str], state=None):
    """One sentence -> (layers [n_layers + 1, n, 2P], final state (c [L, 2, H], h [L, 2, P]))."""
    n_layers, hidden, proj = self.lstm["n_layers"], self.lstm["dim"], self.lstm["projection_dim"]
    if state is None:
      c0, h0 = np.zeros((n_layers, 2, hidden)), np.zeros((n_layers, 2, proj))
    else:
      c0, h0 = (np.array(s, np.float64) for s in state)
    if not tokens:
      return np.zeros((n_layers + 1, 0, 2 * proj)), (c0, h0)
    seq = [chars.BOS_TOKEN] + list(tokens) + [chars.EOS_TOKEN]
    emb = [self.token_embedding(chars.token_to_ids(t)) for t in seq]
    c_out, h_out = c0.copy(), h0.copy()
    tops = {}
    for d in (0, 1):
      x = emb if d == 0 else emb[::-1]
      per_layer = []
      for k in range(n_layers):
        c, h = c0[k, d], h0[k, d]
        out = []
        for xt in x:
          c, h = self._cell(d, k, xt, c, h)
          out.append(h + xt if (k > 0 and self.lstm.get("use_skip_connections")) else h)
        c_out[k, d], h_out[k, d] = c, h
        per_layer.append(out if d == 0 else out[::-1])
        x = out
      tops[d] = per_layer
    tok = np.stack(emb[1:-1])
    layers = [np.concatenate([tok, tok], -1)]
    for k in range(n_layers):
      layers.append(np.concatenate([np.stack(tops[0][k][1:-1]), np.stack(tops[1][k][1:-1])], -1))
    return np.stack(layers), (c_out, h_out)

  def batch(self, sentences: list[list[str]], time: int | None = None, state=None):
    """-> layers [batch, n_layers + 1, time, 2P] (zeros past each length) and the final state per row."""
    n_layers, proj = self.lstm["n_layers"], self.lstm["projection_dim"]
    time = time or max(len(s) for s in sentences)
    out = np.zeros((len(sentences), n_layers + 1, time, 2 * proj))
    cs, hs = [], []
    for b, s in enumerate(sentences):
      st = None if state is None else (state[0][:, :, b], state[1][:, :, b])
      layers, (c, h) = self.sentence(s, st)
      out[b, :, :len(s)] = layers
      cs.append(c)
      hs.append(h)
    return out, (np.stack(cs, 2), np.stack(hs, 2))
