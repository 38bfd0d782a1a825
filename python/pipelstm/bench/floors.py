"""``python -m pipelstm.bench floors``: lower bounds for a GPU run, on paper.

For each benchmark size, the FLOP floor (at fp32 SIMT and at bf16 tensor-core
rates), the memory-traffic floor, and the launch-latency floor of the
sequential time loop, with the time each implies. A first GPU run can be
judged against these at once. Defaults describe one H100 SXM.
"""

import argparse
import sys
from typing import List

from . import report
from .table import Column, add_row, header

__all__ = ["main", "floors"]

SIZES = [(100, 64, 512, 512), (256, 32, 1024, 1024)]  # T, B, I, H
COLUMNS = [
    Column("T", "T"), Column("B", "B"), Column("H", "I=H"), Column("layers", "layers"), Column("dtype", "dtype"),
    Column("flop", "GFLOP", "{:.1f}", 1e-9), Column("t_flop", "floor at FLOP rate ms", "{:.3f}", 1e3),
    Column("traffic", "MB moved", "{:.0f}", 1e-6), Column("t_mem", "floor at bandwidth ms", "{:.3f}", 1e3),
    Column("t_lat", "launch floor ms", "{:.2f}", 1e3),
]


def floors(T: int, B: int, I: int, H: int, layers: int, elem_bytes: int, flops_rate: float, bandwidth: float,
           step_latency: float) -> dict:
    """Floors of forward + backward of `layers` stacked layers (no projection)."""
    flop = 0.0
    traffic = 0.0
    for k in range(layers):
        inp = I if k == 0 else H
        flop += 3 * 2 * T * B * 4 * H * (inp + H)  # forward GEMMs, backward twice that
        # Compulsory traffic: input and output once each way, the workspace
        # (activated gates + cell states) written forward and read backward,
        # the weights read and their gradients written; the recurrent weights
        # once per step and direction unless a persistent kernel keeps them on chip.
        activations = T * B * (inp + H) * 2
        workspace = T * B * 5 * H * 2
        weights = 4 * H * (inp + H) * 2
        recurrent = 2 * T * 4 * H * H
        traffic += (activations + workspace + weights + recurrent) * elem_bytes
    # Per step: one GEMM and one pointwise launch forward, the same backward.
    latency = layers * T * 4 * step_latency
    return dict(flop=flop, traffic=traffic, t_flop=flop / flops_rate, t_mem=traffic / bandwidth, t_lat=latency)


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m pipelstm.bench floors", description=__doc__)
    p.add_argument("--fp32-tflops", type=float, default=50.0, help="fp32 without tensor cores")
    p.add_argument("--bf16-tflops", type=float, default=790.0, help="bf16 dense matrix work")
    p.add_argument("--bandwidth-tbs", type=float, default=3.0, help="memory bandwidth, TB/s")
    p.add_argument("--step-latency-us", type=float, default=3.0, help="one kernel launch on the critical path, µs")
    report.add_arguments(p)
    args = p.parse_args(argv)
    meta = report.metadata("floors", argv)
    rows = []
    print(header(COLUMNS))
    for T, B, I, H in SIZES:
        for layers in (1, 4):
            for dtype, size, rate in (("fp32", 4, args.fp32_tflops), ("bf16", 2, args.bf16_tflops)):
                f = floors(T, B, I, H, layers, size, rate * 1e12, args.bandwidth_tbs * 1e12,
                           args.step_latency_us * 1e-6)
                add_row(rows, COLUMNS, dict(T=T, B=B, H=H, layers=layers, dtype=dtype, **f))
    report.write_json(args.json, meta, COLUMNS, rows)
    return rows
