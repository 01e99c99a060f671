"""The LSTM recurrence written the obvious way in JAX (TF LSTMCell with num_proj; padded steps keep the state).

Shared by the mutation tests (a wrong `gate_order`) and the gradient tests of the hand-written backward pass.
"""
import jax
import jax.numpy as jnp


def plain_lstm_scan(gx, w_h, w_p, mask, c0, h0, cell_clip=None, proj_clip=None, gate_order="ijfo"):
  """Same contract as `elmo_jax.model.lstm.lstm_scan`; the fused gates are split in `gate_order`."""
  def step(carry, inputs):
    c, h = carry
    g, m = inputs
    g = g + jnp.einsum("dbp,dpg->dbg", h, w_h)
    parts = dict(zip(gate_order, jnp.split(g, 4, axis=-1)))
    i, j, f, o = parts["i"], parts["j"], parts["f"], parts["o"]
    c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(j)
    if cell_clip:
      c_new = jnp.clip(c_new, -cell_clip, cell_clip)
    h_new = jnp.einsum("dbh,dhp->dbp", jax.nn.sigmoid(o) * jnp.tanh(c_new), w_p)
    if proj_clip:
      h_new = jnp.clip(h_new, -proj_clip, proj_clip)
    keep = m[..., None]
    return (jnp.where(keep, c_new, c), jnp.where(keep, h_new, h)), jnp.where(keep, h_new, 0.0)
  (c, h), y = jax.lax.scan(step, (c0, h0), (gx, mask))
  return y, (c, h)
