"""The torch side of `train_throughput.py --lstm_compare` (torch and the standard library only).

    python benchmarks/torch_lstm_worker.py H,P,B,T,L,THREADS

Builds a 2-direction stack of L `torch.nn.LSTM(P, H, proj_size=P)` layers with ELMo's skip connections,
prints "ready", then for each stdin line `n` runs n train steps (forward + backward + SGD) and prints their
mean seconds. A process of its own, so that XLA's and torch's thread pools never spin against each other
(in one process torch with 2 threads ran ~10x slower).
"""
import sys
import time

import torch


def main(spec: str) -> None:
  hidden, proj, batch, unroll, n_layers, threads = (int(v) for v in spec.split(","))
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  lstms = [[torch.nn.LSTM(proj, hidden, num_layers=1, proj_size=proj) for _ in range(n_layers)] for _ in range(2)]
  opt = torch.optim.SGD([q for d in lstms for m in d for q in m.parameters()], lr=0.01)
  x = torch.randn(2, unroll, batch, proj)  # [dir, T, B, P], each direction in its reading order
  y = torch.randn(2, unroll, batch, proj)

  def step():
    opt.zero_grad(set_to_none=True)
    loss = 0.0
    for d in range(2):
      h = x[d]
      for k, m in enumerate(lstms[d]):
        o, _ = m(h)
        h = o + h if k > 0 else o  # skip connections as ELMo's
      loss = loss + torch.mean((h - y[d]) ** 2)
    (loss / 2).backward()
    opt.step()

  step()
  print("ready", flush=True)
  for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
      step()
    print((time.perf_counter() - t0) / n, flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
