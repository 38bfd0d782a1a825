"""``python -m pipelstm.bench layer``: the layer op against torch.nn.LSTM.

Forward + backward of one layer, and of a stack of layers built from the
op, against nn.LSTM with the same weights and data, fp32 on the CPU.
"""

import sys
from typing import List, Tuple

import torch
from torch import nn

from ..ops import lstm_layer
from . import report
from .table import Column, add_row, header
from .timing import gemm_gflops, interleaved_times, medians

__all__ = ["main"]

SIZES = [(100, 64, 512, 512), (256, 32, 1024, 1024)]  # T, B, I, H
QUICK_SIZES = [(8, 4, 16, 16)]


def stack_forward(model: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """Runs nn.LSTM's weights layer by layer through the pipelstm op."""
    B, H = x.shape[1], model.hidden_size
    zeros = x.new_zeros(B, H)
    for k in range(model.num_layers):
        w = [getattr(model, f"{n}_l{k}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        x, _, _ = lstm_layer(x, zeros, zeros, *w)
    return x


def flops(T: int, B: int, I: int, H: int, layers: int) -> float:
    """GEMM FLOPs of forward + backward (backward = twice the forward)."""
    forward = 2 * T * B * 4 * H * (I + H) + (layers - 1) * 2 * T * B * 4 * H * (2 * H)
    return 3 * forward


COLUMNS = [
    Column("threads", "threads"), Column("T", "T"), Column("B", "B"), Column("H", "I=H"), Column("layers", "layers"),
    Column("ours", "pipelstm ms", "{:.1f}", 1e3), Column("peer", "nn.LSTM ms", "{:.1f}", 1e3),
    Column("speedup", "speedup", "{:.2f}x"), Column("gflops", "GFLOP/s", "{:.1f}"),
    Column("gemm", "mm GFLOP/s", "{:.1f}"), Column("of_gemm", "of mm", "{:.2f}"),
]


def run(sizes: List[Tuple[int, int, int, int]], threads: List[int], layers: List[int], repeats: int,
        device: str = "cpu") -> List[dict]:
    rows = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        gemm = gemm_gflops(device=device)
        for T, B, I, H in sizes:
            for L in layers:
                torch.manual_seed(0)
                model = nn.LSTM(I, H, num_layers=L).to(device)
                x = torch.randn(T, B, I, device=device, requires_grad=True)

                def ours():
                    stack_forward(model, x).sum().backward()

                def peer():
                    model(x)[0].sum().backward()

                times = interleaved_times({"pipelstm": ours, "nn.LSTM": peer}, repeats, device=device)
                t = medians(times)
                gflops = flops(T, B, I, H, L) / t["pipelstm"] / 1e9
                add_row(rows, COLUMNS, dict(
                    threads=n_threads, T=T, B=B, I=I, H=H, layers=L, ours=t["pipelstm"], peer=t["nn.LSTM"],
                    speedup=t["nn.LSTM"] / t["pipelstm"], gflops=gflops, gemm=gemm, of_gemm=gflops / gemm,
                    samples=times))
    return rows


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("layer", __doc__, threads=(1, 2), repeats=5, quick=report.QUICK)
    p.add_argument("--layers", type=int, nargs="+", default=[1, 4])
    p.add_argument("--device", default="cpu",
                   help="cpu or cuda (against cuDNN there; TF32 off; the GPU grid is `bench gpu`)")
    args = report.parse_arguments(p, argv)
    if torch.device(args.device).type == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda needs a GPU; none is visible here")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        args.threads = args.threads[:1]  # host threads do not matter there
    meta = report.metadata("layer", argv)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {report.isa_label()}"
    print(f"torch {torch.__version__}, fp32 {where}, forward+backward, median of {args.repeats} interleaved runs")
    print(header(COLUMNS))
    rows = run(QUICK_SIZES if args.quick else SIZES, args.threads, args.layers, args.repeats, args.device)
    if args.json:
        if torch.device(args.device).type == "cuda":
            meta["device"] = where
        report.write_json(args.json, meta, COLUMNS, rows)
    return rows
