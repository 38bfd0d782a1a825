"""python -m pipelstm.bench pipeline: the in-process pipeline on the CPU, in one run.

The pipeline issue's model, Embedding (vocab 10k, 512) -> 4 LSTM layers
(H=1024) -> decoder, T=256, B=32 (``--quick``: vocab 1k, 128, H=256, T=64,
B=16), one training step (forward, cross-entropy against random targets
averaged over the tokens, backward), timed as:

* 1 stage with 1 intra-op thread (the reference);

(pipelstm computes the loss as the pipeline's last unit, ``loss_fn=``; with
``--loss-outside`` on the caller's thread from the returned logits instead)
* ``pipelstm.Pipeline`` with 2 CPU stages of 1 thread each, for every K x M
  asked for, with the measured bubble (idle fraction of the stages from the
  timeline, forward and backward passes averaged) next to the theoretical
  (S-1)/(K*M+S-1), and each stage's busy time (forward + backward);
* the peer, ``torch.distributed.pipelining`` (ScheduleGPipe, Schedule1F1B)
  over 2 gloo processes with nn.LSTM stages at the same split, for each
  micro-batch count asked for (``python -m pipelstm.bench pipelining``).

Every time is the best of ``--reps`` steps after one warm-up step.
"""

import argparse
import copy
import os
import tempfile
import time
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .. import LSTM, Pipeline
from .pipelining_peer import SIZES, best_pipelining, make_data


def build(vocab: int, emb: int, hidden: int, layers: int) -> nn.Sequential:
    return nn.Sequential(nn.Embedding(vocab, emb), LSTM(emb, hidden, num_layers=layers), nn.Linear(hidden, vocab))


def step_time(model: Pipeline, x: torch.Tensor, target: torch.Tensor, reps: int) -> float:
    """Best seconds of one training step; `target` is [B, T] as the peer's."""
    best = float("inf")
    for _ in range(reps + 1):  # the first one warms up
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        if model._loss is not None:
            loss, _ = model(x, target=target.t())
        else:
            out, _ = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)), target.t().reshape(-1))
        loss.backward()
        best = min(best, time.perf_counter() - t)
    return best


def stage_busy(model: Pipeline) -> List[float]:
    """Seconds each stage computed in the last step (forward + backward)."""
    busy = [0.0] * len(model.balance)
    for e in model.trace():
        if e["phase"] != "transfer":
            busy[e["stage"]] += (e["end_ns"] - e["start_ns"]) / 1e9
    return busy


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench pipeline")
    ap.add_argument("--quick", action="store_true", help="a small model (vocab 1k, 128, H=256, T=64, B=16)")
    ap.add_argument("--chunks", type=int, nargs="*", default=[8, 16], help="K values to try")
    ap.add_argument("--micro-batches", type=int, nargs="*", default=[1, 2], help="M values to try")
    ap.add_argument("--peer-micro-batches", type=int, nargs="*", default=[2, 4, 8],
                    help="micro-batch counts for the torch.distributed.pipelining peer (none: skip the peer)")
    ap.add_argument("--reps", type=int, default=None, help="timed steps per configuration (default 3, full size 1)")
    ap.add_argument("--timeline", default=None, help="write the best 2-stage run's timeline here (.json, + .png)")
    ap.add_argument("--loss-outside", action="store_true",
                    help="compute the loss on the caller's thread from the logits, not as the pipeline's last unit")
    args = ap.parse_args(argv)
    s = SIZES[args.quick]
    reps = args.reps if args.reps is not None else (3 if args.quick else 1)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the caller's share: the loss between forward and backward
    base = build(s["vocab"], s["emb"], s["hidden"], s["layers"])
    x, target = make_data(s["vocab"], s["T"], s["B"], seed=0)
    print(f"model: Embedding({s['vocab']}, {s['emb']}) -> {s['layers']} x LSTM(H={s['hidden']}) -> "
          f"Linear({s['hidden']}, {s['vocab']}); T={s['T']}, B={s['B']}; one training step (forward, "
          f"cross-entropy, backward), best of {reps}", flush=True)

    loss_fn = None if args.loss_outside else nn.CrossEntropyLoss()
    one = Pipeline(copy.deepcopy(base), devices=["cpu"], threads=1, loss_fn=loss_fn)
    t1 = step_time(one, x, target, reps)
    rows = [("pipelstm, 1 stage, 1 thread", "-", "-", t1, "-", "-", f"{stage_busy(one)[0]:.2f}")]
    best = None
    for K in args.chunks:
        for M in args.micro_batches:
            two = Pipeline(copy.deepcopy(base), devices=["cpu", "cpu"], chunks=K, micro_batches=M, threads=1,
                           loss_fn=loss_fn)
            t2 = step_time(two, x, target, reps)
            with tempfile.TemporaryDirectory() as d:
                b = two.timeline(os.path.join(d, "t.json"))
            bubble = (b["forward_bubble"] + b["backward_bubble"]) / 2
            busy = " / ".join(f"{v:.2f}" for v in stage_busy(two))
            rows.append((f"pipelstm, 2 stages {two.balance}, 1 thread each", str(K), str(M), t2, f"{bubble:.3f}",
                         f"{b['theoretical_bubble']:.3f}", busy))
            print(f"  K={K} M={M}: {t2:.3f} s", flush=True)
            if best is None or t2 < best[0]:
                best = (t2, two)
    for schedule, mb, sec in best_pipelining(args.quick, reps, tuple(args.peer_micro_batches)):
        rows.append((f"torch.distributed.pipelining {schedule}, 2 processes", "-", str(mb), sec, "-", "-", "-"))
        print(f"  peer {schedule} M={mb}: {sec:.3f} s", flush=True)

    best_ours = best[0] if best else t1
    head = ("configuration", "K", "M", "step (s)", "vs 1 stage", "best 2-stage pipelstm vs this",
            "bubble (measured)", "bubble (theory)", "stage busy (s)")
    body = [(r[0], r[1], r[2], f"{r[3]:.3f}", f"{t1 / r[3]:.2f}x", f"{r[3] / best_ours:.2f}x", *r[4:]) for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    print(fmt(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in body:
        print(fmt(row))
    if best is not None:
        busy = stage_busy(best[1])
        print(f"balance bound of the best 2-stage split: {sum(busy) / max(busy):.2f}x "
              "(both stages' busy time over the busier one's: no schedule can beat it)")
    if args.timeline and best is not None:
        model = best[1]
        step_time(model, x, target, 0)
        print("timeline:", model.timeline(args.timeline))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
