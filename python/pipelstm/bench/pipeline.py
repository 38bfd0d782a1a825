"""python -m pipelstm.bench pipeline: the pipeline on the CPU.

Embedding (vocab 10k, 512) -> 4 LSTM layers (H=1024) -> decoder, T=256,
B=32, one training step (forward + backward): 2 CPU stages with 1 intra-op
thread each against the same model on 1 stage with 1 thread, plus the
measured bubble (idle fraction from the timeline) next to the theoretical
(S-1)/(K*M+S-1). ``--quick`` shrinks the model so that it runs in seconds.
"""

import argparse
import copy
import os
import tempfile
import time
from typing import List

import torch
from torch import nn

from .. import LSTM, Pipeline


def build(vocab: int, emb: int, hidden: int, layers: int) -> nn.Sequential:
    return nn.Sequential(nn.Embedding(vocab, emb), LSTM(emb, hidden, num_layers=layers), nn.Linear(hidden, vocab))


def step_time(model: Pipeline, x: torch.Tensor, reps: int) -> float:
    best = float("inf")
    for _ in range(reps + 1):  # the first one warms up
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        out, _ = model(x)
        out.float().mean().backward()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: List[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench pipeline")
    ap.add_argument("--quick", action="store_true", help="a small model (vocab 1k, 128, H=256, T=64, B=16)")
    ap.add_argument("--chunks", type=int, nargs="*", default=None, help="K values to try (default 4 8 16)")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=None, help="M values to try (default 1 2)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--timeline", default=None, help="write the best 2-stage run's timeline here (.json, + .png)")
    args = ap.parse_args(argv)
    if args.quick:
        vocab, emb, hidden, layers, T, B = 1000, 128, 256, 4, 64, 16
    else:
        vocab, emb, hidden, layers, T, B = 10_000, 512, 1024, 4, 256, 32
    reps = args.reps if args.reps is not None else (3 if args.quick else 1)
    Ks = args.chunks or [4, 8, 16]
    Ms = args.micro_batches or [1, 2]
    torch.manual_seed(0)
    base = build(vocab, emb, hidden, layers)
    x = torch.randint(0, vocab, (T, B))
    print(f"model: Embedding({vocab}, {emb}) -> {layers} x LSTM(H={hidden}) -> Linear({hidden}, {vocab}); "
          f"T={T}, B={B}; one training step (forward + backward), best of {reps}")

    one = Pipeline(copy.deepcopy(base), devices=["cpu"], threads=1)
    t1 = step_time(one, x, reps)
    rows = [("1 stage, 1 thread", "-", "-", t1, 1.0, "-", "-")]
    best = None
    for K in Ks:
        for M in Ms:
            two = Pipeline(copy.deepcopy(base), devices=["cpu", "cpu"], chunks=K, micro_batches=M, threads=1)
            t2 = step_time(two, x, reps)
            with tempfile.TemporaryDirectory() as d:
                s = two.timeline(os.path.join(d, "t.json"))
            bubble = (s["forward_bubble"] + s["backward_bubble"]) / 2
            rows.append((f"2 stages {two.balance}, 1 thread each", str(K), str(M), t2, t1 / t2,
                         f"{bubble:.3f}", f"{s['theoretical_bubble']:.3f}"))
            if best is None or t2 < best[0]:
                best = (t2, two)
    head = ("configuration", "K", "M", "step (s)", "speed-up", "bubble (measured)", "bubble (theory)")
    body = [(r[0], r[1], r[2], f"{r[3]:.3f}", f"{r[4]:.2f}x", r[5], r[6]) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(fmt(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print(fmt(b))
    if args.timeline and best is not None:
        model = best[1]
        step_time(model, x, 0)
        print("timeline:", model.timeline(args.timeline))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
