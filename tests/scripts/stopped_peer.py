"""One rank of tests/test_distributed_timeouts.py: two processes (pp=2,
gloo) train one step, then rank --stopped-rank stops itself (SIGSTOP) at
the point --stop names and the other, waiting on it, must fail within
--timeout with an error naming what it waited for.

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python stopped_peer.py --stop loss-broadcast

The survivor prints "[rank r] error: <message>" and exits 1, or "[rank r] done".
"""

import argparse
import datetime
import os
import signal

import torch
import torch.distributed as dist
from torch import nn

import pipelstm
import pipelstm.distributed as pdist

POINTS = ("step", "loss-broadcast", "clip")


def stop_before(name: str, rank: int):
    """Wraps torch.distributed's ``name`` so that its next call stops this process first."""
    original = getattr(dist, name)

    def stopping(*args, **kwargs):
        print(f"[rank {rank}] stopping before {name}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        return original(*args, **kwargs)

    setattr(dist, name, stopping)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stop", choices=POINTS, required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--stopped-rank", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    # Start-up waits on the slower process (imports on a busy machine): a
    # long timeout for the world group; the mesh's groups get --timeout.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    mesh = pdist.init_mesh(pp=2, timeout=args.timeout)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), pipelstm.LSTM(8, 16, num_layers=2), nn.Linear(16, 10))
    pipe = pdist.PipelineParallel(model, mesh, chunks=2, threads=1)
    x, y = torch.randint(0, 10, (6, 4)), torch.randint(0, 10, (6, 4))

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out.reshape(-1, 10), target.reshape(-1))

    pipe.train_step(x, y, loss_fn)  # everything works once
    dist.barrier()
    print(f"[rank {mesh.rank}] first step done", flush=True)
    try:
        if mesh.rank == args.stopped_rank:
            if args.stop == "step":
                print(f"[rank {mesh.rank}] stopping before the step", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            elif args.stop == "loss-broadcast":
                stop_before("broadcast", mesh.rank)
            else:
                stop_before("all_reduce", mesh.rank)
        pipe.train_step(x, y, loss_fn)
        pdist.clip_grad_norm_(pipe.parameters(), 0.1, mesh)
    except RuntimeError as e:
        print(f"[rank {mesh.rank}] error: {e}", flush=True)
        raise SystemExit(1)
    print(f"[rank {mesh.rank}] done", flush=True)


if __name__ == "__main__":
    main()
