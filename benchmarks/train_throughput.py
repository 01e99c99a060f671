"""Training throughput of the biLM on this machine; prints one JSON object.

    python benchmarks/train_throughput.py [--configs=default,small] [--lstm_compare] [--split]

Sections (each can be switched off):
  * `matmul_peak_flops`: a large float32 matmul's FLOP/s measured here, the denominator of the MFU.
  * `train[config]`: `make_train_step` (forward + backward + optimizer) on a 1-device mesh with windows of
    real tokens from data/pd-small/train.txt.gz (char ids), synthetic word-id targets; tokens/s counts the
    batch x unroll token positions (both directions process each), compile time reported separately;
    `mfu` = analytic model FLOPs per token (3x the forward matmul/conv FLOPs, both directions, both char
    CNN passes, the softmax as computed: sampled or full) x tokens/s / matmul peak.
    The step runs on token-deduped batches (config.dedupe_tokens, `data/dedupe.py`, one shard);
    `dedupe` has the distinct tokens per batch vs positions, the table size U, the host cost and, with
    --dedupe_compare, the plain path's tokens/s measured interleaved and the speedup. The MFU counts the
    plain path's FLOPs (every position through the char CNN), so it is an "effective" MFU with dedupe.
  * `split[config]`: time of the jitted forward+backward of each component alone (char CNN over both
    directions' windows, the LSTM stack, the softmax) next to the whole step (the plain step with
    --dedupe_compare), and the char CNN on one deduped table.
  * `lstm_compare`: a 2-layer biLSTM with projection (skip connections, as ELMo), train step = forward +
    backward + SGD, ours (`BiLSTMStack`, jit) vs `torch.nn.LSTM(proj_size=P)` one per layer and direction,
    torch in its own process at 1 and at all threads (baseline: the faster), interleaved rounds, median
    tokens/s and the ratio ours/torch.
    torch is a benchmark-only dependency: `pip install -r benchmarks/requirements.txt`, here or in a venv
    of its own (`--torch_python=/path/to/venv/bin/python`).
Peak RSS (`ru_maxrss`) is reported after each section (it only grows).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any

from absl import app
from absl import flags

import jax
import jax.numpy as jnp
import numpy as np

from bench_util import matmul_peak, peak_rss_mb  # pylint: disable=g-bad-import-order
from elmo_jax.data import chars
from elmo_jax.runtime import memory
from elmo_jax.model import BiLM, BiLMConfig, BiLSTMStack, make_model
from elmo_jax.measure.flops import forward_flops_per_token
from elmo_jax.data import dedupe as dedupe_lib
from elmo_jax.training import losses
from elmo_jax.training import feed, optimizer as optimizer_lib, step as step_lib

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

FLAGS = flags.FLAGS
flags.DEFINE_bool("reuse_freed_memory", True, "glibc keeps freed blocks for reuse (memory.reuse_freed_memory), "
                  "as the command-line entry points do.")
flags.DEFINE_list("configs", ["default", "small"], "configs/<name>.py to time the full train step of.")
flags.DEFINE_integer("small_batch", 32, "Batch rows for the `small` config (its own 128 is slow on a CPU).")
flags.DEFINE_integer("small_vocab", 50_000, "Vocabulary size for the `small` config (sampled softmax).")
flags.DEFINE_integer("default_vocab", 20_000, "Vocabulary size for the `default` config.")
flags.DEFINE_integer("steps", 10, "Timed train steps per config.")
flags.DEFINE_bool("dedupe_compare", True, "Also time the train step without token dedupe (interleaved).")
flags.DEFINE_bool("split", True, "Also time char CNN / LSTM / softmax alone.")
flags.DEFINE_bool("lstm_compare", True, "Compare the biLSTM train step with torch.nn.LSTM(proj_size=...).")
flags.DEFINE_list("lstm_sizes", "512x128x64,1024x128x32", "hidden x projection x batch, comma-separated.")
flags.DEFINE_integer("lstm_rounds", 5, "Interleaved rounds of the LSTM comparison.")
flags.DEFINE_integer("lstm_steps", 10, "Train steps per round and framework.")
flags.DEFINE_integer("scan_unroll", -1, "Override config.scan_unroll (-1: the config's).")
flags.DEFINE_string("torch_python", sys.executable, "Python with torch for the LSTM comparison's worker "
                    "(benchmarks/torch_lstm_worker.py; it needs nothing else), e.g. a separate venv's.")
flags.DEFINE_string("data", os.path.join(_ROOT, "data", "pd-small", "train.txt.gz"), "Token source.")


def _block(x):
  return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


def load_config(name: str):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(_ROOT, "configs", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


def token_stream(path: str, n_tokens: int) -> list[str]:
  out: list[str] = []
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    for line in f:
      toks = line.split()
      if toks:
        out += [chars.BOS_TOKEN] + toks + [chars.EOS_TOKEN]
      if len(out) >= n_tokens:
        break
  while len(out) < n_tokens:  # a tiny file: repeat it
    out += out
  return out[:n_tokens]


def make_batches(path: str, n_batches: int, batch: int, unroll: int, max_chars: int, vocab: int):
  """Windows of real tokens as char ids; targets are the next token's (hashed) id in each direction."""
  toks = token_stream(path, n_batches * batch * unroll + 1)
  mapper = chars.CharMapper(max_chars) if hasattr(chars, "CharMapper") else None
  ids = np.stack([(mapper(t) if mapper else chars.token_to_ids(t, max_chars)) for t in toks]).astype(np.int32)
  word = np.array([hash(t) % vocab for t in toks], np.int32)
  out = []
  for k in range(n_batches):
    sl = slice(k * batch * unroll, (k + 1) * batch * unroll)
    c = ids[sl].reshape(batch, unroll, max_chars)
    w = word[k * batch * unroll + 1:(k + 1) * batch * unroll + 1].reshape(batch, unroll)
    out.append({"fwd_chars": c, "bwd_chars": c[:, ::-1].copy(), "fwd_targets": w,
                "bwd_targets": w[:, ::-1].copy(), "weights": np.ones((batch, unroll), np.float32)})
  return out


def _timeit(fn, args, n: int) -> float:
  """Median seconds of `fn(*args)` over n calls (already compiled)."""
  ts = []
  for _ in range(n):
    t = time.perf_counter()
    _block(fn(*args))
    ts.append(time.perf_counter() - t)
  return statistics.median(ts)


def _time_variants(train_step, state, variants: dict[str, list]) -> tuple[dict[str, list[float]], float, Any, Any]:
  """({variant: step seconds}, total compile seconds, the state, the last metrics): each variant's batches
  through its own compiled step, interleaved, so all variants see the same machine load."""
  compiled, compile_s = {}, 0.0
  for name, dev in variants.items():
    t0 = time.perf_counter()
    compiled[name] = train_step.lower(state, dev[0]).compile()
    compile_s += time.perf_counter() - t0
    state, m = compiled[name](state, dev[0])
    _block(m)
  times: dict[str, list[float]] = {name: [] for name in variants}
  for k in range(FLAGS.steps):
    for name, dev in variants.items():
      t0 = time.perf_counter()
      state, m = compiled[name](state, dev[k % len(dev)])
      _block(m)
      times[name].append(time.perf_counter() - t0)
  return times, compile_s, state, m


def bench_train(name: str, peak: float) -> dict[str, Any]:
  config = load_config(name)
  if name == "small":
    config.batch_size = FLAGS.small_batch
  vocab = FLAGS.small_vocab if name == "small" else FLAGS.default_vocab
  if FLAGS.scan_unroll >= 0:
    config.scan_unroll = FLAGS.scan_unroll
  options = config.options.to_dict()
  num_sampled = int(config.n_negative_samples) if config.n_negative_samples < vocab else 0
  model = make_model(options, dropout=config.dropout, dtype=config.dtype, unroll=config.get("scan_unroll", 1))
  optimizer = optimizer_lib.make_optimizer(config)
  mesh = step_lib.make_mesh(jax.devices()[:1])
  b, t = int(config.batch_size), int(config.unroll_steps)
  state = step_lib.create_train_state(model, optimizer, vocab, b, int(config.seed))
  shardings = step_lib.state_shardings(state, mesh)
  state = jax.device_put(state, shardings)
  train_step = step_lib.make_train_step(model, optimizer, mesh, shardings, num_sampled)
  batches = make_batches(FLAGS.data, 4, b, t, options["char_cnn"]["max_characters_per_token"], vocab)
  t0 = time.perf_counter()
  deduped = [dedupe_lib.dedupe_batch(x, 1) for x in batches]
  dedupe_ms = (time.perf_counter() - t0) / len(batches) * 1e3
  variants = {"dedupe": [feed.device_batch(x, mesh) for x in deduped],
              "plain": [feed.device_batch(x, mesh) for x in batches]}
  if not FLAGS.dedupe_compare:
    variants.pop("plain")

  times, compile_s, state, m = _time_variants(train_step, state, variants)
  if "plain" in times:
    plain_s = statistics.median(times["plain"])
  times = times["dedupe"]
  step_s = statistics.median(times)
  flops = forward_flops_per_token(options, vocab, num_sampled)
  tok_s = b * t / step_s
  out = {"batch": b, "unroll": t, "vocab": vocab, "num_sampled": num_sampled, "dtype": config.dtype,
         "scan_unroll": int(config.get("scan_unroll", 1)), "lstm_dim": options["lstm"]["dim"],
         "projection_dim": options["lstm"]["projection_dim"], "compile_s": round(compile_s, 2),
         "step_s_median": round(step_s, 4), "step_s_min": round(min(times), 4), "tokens_per_s": round(tok_s, 1),
         "train_flops_per_token": 3 * flops["total"], "forward_flops_per_token": flops,
         "achieved_gflops": round(3 * flops["total"] * tok_s / 1e9, 2),
         "mfu": round(3 * flops["total"] * tok_s / peak, 4), "loss": float(m["loss"]),
         "peak_rss_mb": round(peak_rss_mb(), 1)}
  # Dedupe stats: distinct tokens of the batch's fwd+bwd windows (= char CNN rows with a token; the table
  # is padded up to U) against the 2 * B * T positions the plain path embeds.
  distinct = [dedupe_lib.distinct_tokens(x) for x in deduped]
  out["dedupe"] = {"positions": 2 * b * t, "distinct_tokens": distinct,
                   "table_u": [x["token_chars"].shape[1] for x in deduped], "host_ms_per_batch": round(dedupe_ms, 2)}
  if FLAGS.dedupe_compare:
    out["dedupe"].update(step_s_median_plain=round(plain_s, 4), tokens_per_s_plain=round(b * t / plain_s, 1),
                         speedup=round(plain_s / step_s, 3))
  if FLAGS.split:
    out["split"] = split_times(model, state.params, batches[0], num_sampled,
                               plain_s if FLAGS.dedupe_compare else step_s)
  return out


def split_times(model: BiLM, params, batch, num_sampled: int, step_s: float) -> dict[str, Any]:
  """Forward+backward time of each component alone (jit, median of 5), and its share of a step."""
  bilm = params["bilm"]
  fc, bc = jnp.asarray(batch["fwd_chars"]), jnp.asarray(batch["bwd_chars"])
  both = jnp.concatenate([fc, bc], 0)
  emb = model.apply({"params": bilm}, both, method=BiLM.embed_tokens)
  fe, be = jnp.split(emb, 2, 0)
  fm, bm = jnp.any(fc > 0, -1), jnp.any(bc > 0, -1)
  top = jax.random.normal(jax.random.PRNGKey(0), (2,) + fe.shape)
  tgt = jnp.stack([jnp.asarray(batch["fwd_targets"]), jnp.asarray(batch["bwd_targets"])])
  key = jax.random.PRNGKey(1)

  def cnn_loss(p):
    return jnp.sum(model.apply({"params": p}, both, method=BiLM.embed_tokens) * 1e-3)

  def lstm_loss(p):
    out, _ = model.apply({"params": p}, fe, be, fm, bm, None, True, method=lambda m, *a: m.lstm(*a))
    return jnp.sum(out[-1] * 1e-3)

  def softmax_loss(sp, h):
    w, b = sp["W"], sp["b"]
    if num_sampled:
      return sum(jnp.mean(losses.sampled_softmax_nll(h[d], tgt[d], w, b, key, num_sampled, model.dtype))
                 for d in range(2))
    return sum(jnp.mean(losses.full_softmax_nll(h[d], tgt[d], w, b, model.dtype)) for d in range(2))

  parts = {"char_cnn": (jax.jit(jax.grad(cnn_loss)), (bilm,)),
           "lstm": (jax.jit(jax.grad(lstm_loss)), (bilm,)),
           "softmax": (jax.jit(jax.grad(softmax_loss, argnums=(0, 1))), (params["softmax"], top))}
  out = {}
  for name, (fn, args) in parts.items():
    _block(fn(*args))
    s = _timeit(fn, args, 5)
    out[name] = {"fwd_bwd_s": round(s, 4), "share_of_step": round(s / step_s, 3)}
  out["rest_share"] = round(1.0 - sum(v["share_of_step"] for v in out.values()), 3)
  # Not part of the shares above (they add up the plain path): the char CNN on the deduped table alone.
  table = jnp.asarray(dedupe_lib.dedupe_batch(batch, 1)["token_chars"][0])
  fn = jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, table, method=BiLM.embed_tokens) * 1e-3)))
  _block(fn(bilm))
  s = _timeit(fn, (bilm,), 5)
  out["char_cnn_deduped_table"] = {"rows": int(table.shape[0]), "fwd_bwd_s": round(s, 4),
                                   "share_of_plain_step": round(s / step_s, 3)}
  return out


# ----------------------------------------------------------------------------------------------------------
# biLSTM vs torch.nn.LSTM(proj_size=...)
# ----------------------------------------------------------------------------------------------------------
def _torch_workers(threads: list[int], shape: str) -> dict[int, Any]:
  """{threads: a ready torch_lstm_worker.py process} for the LSTM of `shape` ("hidden,proj,batch,unroll,layers")."""
  import subprocess  # pylint: disable=g-import-not-at-top
  workers = {}
  for nt in threads:
    workers[nt] = subprocess.Popen(
        [FLAGS.torch_python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_lstm_worker.py"),
         f"{shape},{nt}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert workers[nt].stdout.readline().strip() == "ready"
  return workers


def lstm_compare(hidden: int, proj: int, batch: int, unroll: int = 20, n_layers: int = 2,
                 scan_unroll: int = 1) -> dict[str, Any]:
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, batch, unroll, proj)).astype(np.float32))  # [dir, B, T, P]
  y = jnp.asarray(rng.standard_normal((2, batch, unroll, proj)).astype(np.float32))

  # ours: the real BiLSTMStack (cell/proj clips 3 and skip connections, as ELMo; torch has no clips)
  shape = BiLMConfig(filters=(), char_dim=0, n_highway=0, activation="relu", max_characters_per_token=50,
                     lstm_dim=hidden, projection_dim=proj, n_layers=n_layers, cell_clip=3.0, proj_clip=3.0,
                     use_skip_connections=True)  # the char CNN fields are not read by the LSTM stack
  stack = BiLSTMStack(shape, unroll=scan_unroll)
  mask = jnp.ones((batch, unroll), bool)
  params = stack.init(jax.random.PRNGKey(0), x[0], x[1], mask, mask)["params"]

  def loss_fn(p, x, y):
    out, _ = stack.apply({"params": p}, x[0], x[1], mask, mask)
    return jnp.mean((out[-1] - y) ** 2)

  def ours_step(p, x, y):
    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    return jax.tree_util.tree_map(lambda a, b: a - 0.01 * b, p, g), loss
  ours_step = jax.jit(ours_step, donate_argnums=(0,))
  t0 = time.perf_counter()
  params, l = ours_step(params, x, y)
  l.block_until_ready()
  compile_s = time.perf_counter() - t0

  threads = sorted({1, os.cpu_count() or 1})
  workers = _torch_workers(threads, f"{hidden},{proj},{batch},{unroll},{n_layers}")
  ours_t: list[float] = []
  torch_t: dict[int, list[float]] = {nt: [] for nt in threads}
  n = FLAGS.lstm_steps
  for _ in range(FLAGS.lstm_rounds):  # interleaved rounds: all see the same (shared) machine load
    t0 = time.perf_counter()
    for _ in range(n):
      params, l = ours_step(params, x, y)
    l.block_until_ready()
    ours_t.append((time.perf_counter() - t0) / n)
    for nt, w in workers.items():
      w.stdin.write(f"{n}\n")
      w.stdin.flush()
      torch_t[nt].append(float(w.stdout.readline()))
  for w in workers.values():
    w.stdin.close()
    w.wait()
  tok = batch * unroll
  o = statistics.median(ours_t)
  torch_tok = {nt: round(tok / statistics.median(v), 1) for nt, v in torch_t.items()}
  best = max(torch_tok, key=torch_tok.get)  # the baseline is torch at its best thread count
  ratios = [b / a for a, b in zip(ours_t, torch_t[best])]
  return {"hidden": hidden, "projection": proj, "batch": batch, "unroll": unroll, "layers": n_layers,
          "scan_unroll": scan_unroll, "ours_compile_s": round(compile_s, 2),
          "ours_tokens_per_s": round(tok / o, 1), "torch_tokens_per_s_by_threads": torch_tok,
          "torch_tokens_per_s": torch_tok[best], "torch_threads": best,
          "ratio_ours_over_torch": round(tok / o / torch_tok[best], 3),
          "ratio_per_round": [round(r, 3) for r in ratios], "peak_rss_mb": round(peak_rss_mb(), 1)}


def main(argv):
  del argv
  # first, before JAX allocates, as the command-line entry points do (elmo_jax/runtime/memory.py)
  reused = FLAGS.reuse_freed_memory and memory.reuse_freed_memory()
  result: dict[str, Any] = {"jax": jax.__version__, "backend": jax.default_backend(), "cpus": os.cpu_count(),
                            "xla_flags": os.environ.get("XLA_FLAGS", "")}
  result["reuse_freed_memory"] = reused
  peak = matmul_peak()
  result["matmul_peak_flops"] = peak
  if FLAGS.lstm_compare:
    unroll = FLAGS.scan_unroll if FLAGS.scan_unroll >= 0 else int(load_config("default").get("scan_unroll", 1))
    result["lstm_compare"] = []
    for spec in FLAGS.lstm_sizes:
      h, p, b = (int(v) for v in spec.split("x"))
      r = lstm_compare(h, p, b, scan_unroll=max(unroll, 1))
      print(json.dumps(r), file=sys.stderr)
      result["lstm_compare"].append(r)
  result["train"] = {}
  for name in [c for c in FLAGS.configs if c]:
    r = bench_train(name, peak)
    print(json.dumps({name: r}), file=sys.stderr)
    result["train"][name] = r
  result["peak_rss_mb"] = round(peak_rss_mb(), 1)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  app.run(main)
