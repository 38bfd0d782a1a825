"""``python -m pipelstm.bench peak``: the cores' FMA peak, the ceiling of every rate.

The fused kernels' register-only FMA loop (``kernels/cpu_recurrent.h``,
``fma_loop``: 12 independent chains of vector FMAs, no memory access) in
the build that ``PIPELSTM_CPU_ISA`` picks, on 1 and 2 threads started
together, against a large square ``torch.mm`` at the same thread count.
No GEMM, LSTM layer or model step can run faster per core than this loop:
a ratio an aim asks for can be checked against it (docs/benchmarks.md).
Every figure is the median of ``--repeats`` runs, the loop and the mm
alternated.
"""

import statistics
import sys
from typing import List, Optional

import torch

from .. import _C
from . import report
from .table import Column, add_row, header
from .timing import interleaved_times, spread

__all__ = ["main", "fma_gflops"]

COLUMNS = [
    Column("threads", "threads"), Column("isa", "pipelstm ISA"), Column("vec", "floats per vector"),
    Column("fma_gflops", "FMA loop GFLOP/s", "{:.0f}"), Column("fma_spread", "min-max (s)"),
    Column("mm_gflops", "torch.mm GFLOP/s", "{:.0f}"), Column("mm_of_peak", "mm / FMA loop", "{:.2f}"),
]


def fma_gflops(threads: int, iterations: int) -> float:
    """GFLOP/s of one run of the FMA loop on ``threads`` threads."""
    return _C._fma_loop_flop(iterations) * threads / _C._fma_loop_seconds(threads, iterations) / 1e9


def main(argv: Optional[List[str]] = None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("peak", __doc__, threads=(1, 2), repeats=7,
                               quick="short runs, to check that the benchmark runs")
    p.add_argument("--iterations", type=int, default=50_000_000, help="FMAs per chain and thread in one run")
    p.add_argument("--mm", type=int, default=2048, help="the size of the square torch.mm")
    args = report.parse_arguments(p, argv)
    if any(t < 1 for t in args.threads):
        p.error(f"--threads must be at least 1, got {args.threads}")
    if args.iterations < 1 or args.mm < 1:
        p.error("--iterations and --mm must be at least 1")
    iterations, n = (100_000, 256) if args.quick else (args.iterations, args.mm)
    meta = report.metadata("peak", argv)
    vec = round(_C._fma_loop_flop(1) / 24)  # 12 chains x 2 FLOP per lane
    rows = []
    print(header(COLUMNS))
    previous = torch.get_num_threads()
    a, b = torch.randn(n, n), torch.randn(n, n)
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            times = interleaved_times({"fma": lambda: _C._fma_loop_seconds(threads, iterations),
                                       "mm": lambda: torch.mm(a, b)}, args.repeats)
            fma_seconds = statistics.median(times["fma"])
            mm = 2 * n**3 / statistics.median(times["mm"]) / 1e9
            fma = _C._fma_loop_flop(iterations) * threads / fma_seconds / 1e9
            add_row(rows, COLUMNS, dict(threads=threads, isa=_C.cpu_isa(), vec=vec, fma_gflops=fma,
                                        fma_spread=spread(times["fma"]), mm_gflops=mm, mm_of_peak=mm / fma,
                                        iterations=iterations, mm_size=n, samples=times["fma"]))
    finally:
        torch.set_num_threads(previous)
    report.write_json(args.json, meta, COLUMNS, rows, notes=[
        f"FMA loop: 12 chains x {iterations} vector FMAs per thread on registers, the threads released "
        f"together; torch.mm: {n} x {n} float32 at the same threads; medians of {args.repeats} "
        "alternated runs."])
    return rows
