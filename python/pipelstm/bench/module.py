"""``python -m pipelstm.bench module``: pipelstm.LSTM against torch.nn.LSTM.

Forward + backward of the whole module with the same weights and data on
the CPU: dense input with 1 and 4 layers, bidirectional, and a
PackedSequence whose lengths are drawn uniformly from [T/2, T].

``--dtype bfloat16`` / ``float16`` compares the two modules converted to
that dtype (``.to(dtype)``, input in that dtype too), at smaller default
sizes (T=50 B=16 I=H=256): nn.LSTM computes in the reduced dtype, which on
CPUs without native bfloat16 arithmetic takes seconds per step; pipelstm
computes in float32 and rounds the results.
"""

import sys
from typing import List

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from ..lstm import LSTM
from . import report
from .table import Column, add_row, header
from .timing import interleaved_times, medians

__all__ = ["main"]

COLUMNS = [
    Column("threads", "threads"), Column("dtype", "dtype"), Column("case", "case"), Column("ours", "pipelstm.LSTM ms", "{:.1f}", 1e3),
    Column("peer", "nn.LSTM ms", "{:.1f}", 1e3), Column("speedup", "speedup", "{:.2f}x"),
]

CASES = [
    dict(name="1 layer", layers=1, bidirectional=False, packed=False),
    dict(name="4 layers", layers=4, bidirectional=False, packed=False),
    dict(name="bidirectional", layers=1, bidirectional=True, packed=False),
    dict(name="packed", layers=1, bidirectional=False, packed=True),
]


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_input(T: int, B: int, I: int, packed: bool, dtype: torch.dtype = torch.float32):
    """A leaf tensor, or a PackedSequence whose data is a leaf."""
    if not packed:
        return torch.randn(T, B, I, dtype=dtype, requires_grad=True)
    lengths = torch.randint(T // 2, T + 1, (B,))
    seq = pack_padded_sequence(torch.randn(T, B, I, dtype=dtype), lengths, enforce_sorted=False)
    seq.data.requires_grad_()
    return seq


def run(T: int, B: int, I: int, H: int, threads: List[int], repeats: int, dtype: str = "float32") -> List[dict]:
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for case in CASES:
            torch.manual_seed(0)
            kw = dict(num_layers=case["layers"], bidirectional=case["bidirectional"])
            peer = nn.LSTM(I, H, **kw).to(DTYPES[dtype])
            ours = LSTM(I, H, **kw).to(DTYPES[dtype])
            ours.load_state_dict(peer.state_dict())
            inp = make_input(T, B, I, case["packed"], DTYPES[dtype])

            def step(model):
                out = model(inp)[0]
                (out.data if case["packed"] else out).float().sum().backward()

            times = interleaved_times({"ours": lambda: step(ours), "peer": lambda: step(peer)}, repeats)
            t = medians(times)
            add_row(rows, COLUMNS, dict(threads=n_threads, dtype=dtype, case=case["name"], T=T, B=B, I=I, H=H,
                                        ours=t["ours"], peer=t["peer"], speedup=t["peer"] / t["ours"], samples=times))
    return rows


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("module", __doc__, threads=(1, 2), repeats=5, quick=report.QUICK)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32",
                   help="both modules in this dtype (default float32)")
    args = report.parse_arguments(p, argv)
    meta = report.metadata("module", argv)
    if args.quick:
        T, B, I, H = 8, 4, 16, 16
    else:
        T, B, I, H = (100, 64, 512, 512) if args.dtype == "float32" else (50, 16, 256, 256)
    print(f"torch {torch.__version__}, {args.dtype} CPU, {report.isa_label()}, forward+backward, T={T} B={B} "
          f"I=H={H}, median of {args.repeats} interleaved runs")
    print(header(COLUMNS))
    rows = run(T, B, I, H, args.threads, args.repeats, args.dtype)
    report.write_json(args.json, meta, COLUMNS, rows)
    return rows
