"""``python -m pipelstm.bench wavefront``: where the layer wavefront beats intra-op threads.

A stacked LSTM on N cores can use them two ways in one process: every layer
op with N intra-op threads (``pipelstm.LSTM``, and ``nn.LSTM``), or the
layers split into N stages of one thread each, run as a wavefront over K
time chunks (``pipelstm.LSTM(devices=["cpu"] * N, threads=1, chunks=K)``:
layer l works on chunk k while layer l+1 works on chunk k-1). Threads split
each step's GEMM and pointwise work, which pays only when a step holds
enough of it; the wavefront splits the layers, which pays whenever the
stages balance, but adds the engine's per-item cost and a bubble of
(N-1)/(K+N-1).

Each row: T=128, I=H, one shape (H, B, layers), forward+backward or
forward only (``torch.no_grad``), all configurations stepped in turn, the
median of ``--repeats`` runs each (a run of a call under ``--min-run-ms``
the mean of as many calls as fill it, as in ``bench grid``); the speedups
are against nn.LSTM with N threads (its default settings: oneDNN where it
applies). ``best wavefront``
is the faster of the chunk counts tried, and ``wavefront / threads`` says
whether it beats pipelstm.LSTM on N intra-op threads (> 1: it does).
"""

import sys
from typing import List

import torch
from torch import nn

from ..lstm import LSTM
from . import report
from .table import Column, add_row, header
from .timing import add_min_run_argument, interleaved_times, medians

__all__ = ["main"]

COLUMNS = [
    Column("pass", "pass"), Column("H", "H"), Column("B", "B"), Column("layers", "layers"),
    Column("peer", "nn.LSTM ms", "{:.2f}", 1e3), Column("threads_ms", "pipelstm threads ms", "{:.2f}", 1e3),
    Column("wave_ms", "best wavefront ms", "{:.2f}", 1e3), Column("K", "its K"),
    Column("threads_x", "threads vs nn", "{:.2f}x"), Column("wave_x", "wavefront vs nn", "{:.2f}x"),
    Column("wave_vs_threads", "wavefront / threads", "{:.2f}x"),
]


def run(T: int, sizes: List[int], batches: List[int], layers: List[int], chunks: List[int], cores: int,
        passes: List[str], repeats: int, min_run: float = 0.0) -> List[dict]:
    torch.set_num_threads(cores)
    rows = []
    for mode in passes:
        for L in layers:
            for H in sizes:
                for B in batches:
                    torch.manual_seed(0)
                    peer = nn.LSTM(H, H, num_layers=L)
                    ours = LSTM(H, H, num_layers=L)
                    ours.load_state_dict(peer.state_dict())
                    waves = {}
                    for K in chunks:
                        w = LSTM(H, H, num_layers=L, devices=["cpu"] * cores, threads=1, chunks=K)
                        w.load_state_dict(peer.state_dict())
                        waves[K] = w
                    x = torch.randn(T, B, H, requires_grad=mode == "fwd+bwd")

                    def step(model):
                        if mode == "fwd+bwd":
                            model(x)[0].sum().backward()
                        else:
                            with torch.no_grad():
                                model(x)
                    fns = {"peer": lambda: step(peer), "threads": lambda: step(ours)}
                    fns.update({f"wave{K}": (lambda m: lambda: step(m))(m) for K, m in waves.items()})
                    times = interleaved_times(fns, repeats, min_run_seconds=min_run)
                    t = medians(times)
                    best_k = min(chunks, key=lambda K: t[f"wave{K}"])
                    wave = t[f"wave{best_k}"]
                    add_row(rows, COLUMNS, dict(
                        **{"pass": mode}, T=T, H=H, B=B, layers=L, cores=cores, peer=t["peer"],
                        threads_ms=t["threads"], wave_ms=wave, K=best_k,
                        threads_x=t["peer"] / t["threads"], wave_x=t["peer"] / wave,
                        wave_vs_threads=t["threads"] / wave,
                        wave_by_k={K: t[f"wave{K}"] for K in chunks}, samples=times,
                    ))
    return rows


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("wavefront", __doc__, repeats=5, per="configuration", quick=report.QUICK)
    p.add_argument("--cores", type=int, default=2, help="N: intra-op threads, or stages of one thread (default 2)")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512], help="H (= I)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--chunks", type=int, nargs="+", default=None,
                   help="K values tried for the wavefront (default 4 16; --quick: 2)")
    p.add_argument("--passes", nargs="+", choices=["fwd+bwd", "forward"], default=["fwd+bwd", "forward"])
    add_min_run_argument(p)
    args = report.parse_arguments(p, argv)
    if args.quick:
        args.sizes, args.batches, args.layers, T = [16], [2], [2], 8
        args.chunks = args.chunks or [2]
    else:
        T = 128
        args.chunks = args.chunks or [4, 16]
    meta = report.metadata("wavefront", argv)
    print(f"torch {torch.__version__}, float32 CPU, {report.isa_label()}, {args.cores} cores: nn.LSTM and "
          f"pipelstm.LSTM with {args.cores} intra-op threads against the layer wavefront of {args.cores} stages x 1 "
          f"thread, T={T}, I=H, median of {args.repeats} interleaved runs, a run of a short call the mean of as many "
          f"calls as fill {args.min_run_ms:g} ms")
    print(header(COLUMNS))
    rows = run(T, args.sizes, args.batches, args.layers, args.chunks, args.cores, args.passes, args.repeats,
               args.min_run_ms / 1e3)
    if args.json:
        wins = [r for r in rows if r["wave_vs_threads"] > 1.0]
        note = (f"The wavefront beat {args.cores} intra-op threads in {len(wins)} of {len(rows)} rows"
                + (": " + "; ".join(f"{r['pass']} H={r['H']} B={r['B']} {r['layers']} layers "
                                    f"{r['wave_vs_threads']:.2f}x" for r in wins) if wins else "") + ".")
        report.write_json(args.json, meta, COLUMNS, rows, notes=[note])
    return rows
