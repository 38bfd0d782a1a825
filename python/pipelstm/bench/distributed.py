"""python -m pipelstm.bench distributed: pp=2 over 2 processes against 1 process
and against torch.distributed.pipelining, in one run on the CPU.

The model of the pipeline benchmark (Embedding -> 4 LSTM layers -> decoder;
``--quick`` shrinks it), one training step (forward + backward, mean
cross-entropy), 1 intra-op thread per process, gloo. Each configuration is
timed in fresh processes: barrier, step, the slowest rank's time; best of
``--reps`` after a warm-up.
"""

import argparse
import math
import os
import socket
import tempfile
import time
from typing import List, Optional

import torch
from torch import nn

from .pipelining_peer import SIZES, best_pipelining, make_data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, chunks: int, micro_batches: int, quick: bool, reps: int,
            result_path: str) -> None:
    import torch.distributed as dist

    from .. import LSTM
    from .. import distributed as pdist

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    mesh = pdist.init_mesh(pp=world, timeout=1800)
    try:
        s = SIZES[quick]
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(s["vocab"], s["emb"]), LSTM(s["emb"], s["hidden"], num_layers=s["layers"]),
                              nn.Linear(s["hidden"], s["vocab"]))
        pipe = pdist.PipelineParallel(model, mesh, chunks=chunks, micro_batches=micro_batches, carry_state=False,
                                      threads=1, loss_fn=nn.CrossEntropyLoss())  # the loss inside the last stage
        x, target = make_data(s["vocab"], s["T"], s["B"], 0)
        target = target.t()  # time-major here
        best = math.inf
        for i in range(reps + 1):
            pipe.zero_grad(set_to_none=True)
            dist.barrier()
            start = time.perf_counter()
            pipe.train_step(x, target)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if i > 0:
                best = min(best, elapsed.item())
        if rank == 0:
            with open(result_path, "w") as f:
                f.write(repr(best))
    finally:
        dist.destroy_process_group()


def time_pipelstm(pp: int, chunks: int, micro_batches: int, *, quick: bool, reps: int) -> float:
    """Best seconds of one training step of pipelstm.distributed over ``pp`` processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="bench_distributed") as d:
        path = os.path.join(d, "seconds")
        mp.start_processes(_worker, args=(pp, _free_port(), chunks, micro_batches, quick, reps, path), nprocs=pp,
                           join=True, start_method="spawn")
        with open(path) as f:
            return float(f.read())


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pipelstm.bench distributed")
    ap.add_argument("--quick", action="store_true", help="vocab 1k, 128, H=256, T=64, B=16")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chunks", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--micro-batches", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--peer-micro-batches", type=int, nargs="*", default=[2, 4, 8])
    args = ap.parse_args(argv)
    s = SIZES[args.quick]
    print(f"model: Embedding({s['vocab']}, {s['emb']}) -> {s['layers']} x LSTM(H={s['hidden']}) -> "
          f"Linear({s['hidden']}, {s['vocab']}); T={s['T']}, B={s['B']}; 1 thread per process, gloo; "
          f"best of {args.reps}", flush=True)
    one = time_pipelstm(1, 1, 1, quick=args.quick, reps=args.reps)
    rows = [("pipelstm, 1 process", "-", "-", one)]
    for K in args.chunks:
        for M in args.micro_batches:
            rows.append(("pipelstm, pp=2 over 2 processes", str(K), str(M),
                         time_pipelstm(2, K, M, quick=args.quick, reps=args.reps)))
    best_ours = min(r[3] for r in rows[1:])
    peers = best_pipelining(args.quick, args.reps, tuple(args.peer_micro_batches))
    for schedule, mb, sec in peers:
        rows.append((f"torch.distributed.pipelining {schedule}, 2 processes", "-", str(mb), sec))
    print("| configuration | K | M | step (s) | vs 1 process | pipelstm pp=2 best vs this |")
    print("|---|---|---|---|---|---|")
    for name, K, M, sec in rows:
        print(f"| {name} | {K} | {M} | {sec:.3f} | {one / sec:.2f}x | {sec / best_ours:.2f}x |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
