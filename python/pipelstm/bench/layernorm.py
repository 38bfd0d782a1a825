"""``python -m pipelstm.bench layernorm``: what LayerNorm costs, fused and as users write it.

A 2-layer stack, forward + backward in training, on the CPU (or ``--device
cuda``), each side with the same weights and input, run alternately:

* ``plain``: ``pipelstm.LSTM`` (no LayerNorm), the floor;
* ``layernorm``: ``pipelstm.LayerNormLSTM``;
* ``cell_loop``: the same model as users write it today: per layer a
  Python loop over steps of a LayerNorm LSTM cell made of ``torch.mm`` and
  three ``nn.LayerNorm`` (as torch's own ``benchmarks/fastrnns``).

A row gives each side's median time, ``layernorm / plain`` (the cost of the
normalisation) and ``cell_loop / layernorm`` (> 1: the fused layer faster).
"""

import sys
from typing import List

import torch
from torch import nn

from ..layernorm_lstm import LayerNormLSTM
from ..lstm import LSTM
from . import report
from .table import Column, header
from .cell_loop import CellLoop
from .timing import add_device_argument, check_device, device_label, training_step_rows

__all__ = ["LayerNormCellLoop", "main"]

COLUMNS = [
    Column("threads", "threads"), Column("T", "T"), Column("B", "B"), Column("H", "I=H"),
    Column("plain", "pipelstm.LSTM ms", "{:.1f}", 1e3), Column("layernorm", "LayerNormLSTM ms", "{:.1f}", 1e3),
    Column("cell_loop", "LayerNorm cell loop ms", "{:.1f}", 1e3),
    Column("cost", "layernorm / plain", "{:.3f}x"), Column("speedup", "loop / layernorm", "{:.2f}x"),
]
LAYERS = 2


class _Cell(nn.Module):
    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        H = self.hidden_size = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * H, H))
        self.bias = nn.Parameter(torch.empty(4 * H))
        self.norm_ih = nn.LayerNorm(4 * H, bias=False)
        self.norm_hh = nn.LayerNorm(4 * H, bias=False)
        self.norm_c = nn.LayerNorm(H)

    def forward(self, x, state):
        h, c = state
        gates = self.norm_ih(torch.mm(x, self.weight_ih.t())) + self.norm_hh(torch.mm(h, self.weight_hh.t())) + self.bias
        i, f, g, o = gates.chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(self.norm_c(c)), c


class LayerNormCellLoop(CellLoop):
    """A LayerNorm LSTM the way users write it: a cell per layer stepped in
    Python; the weights copied from a :class:`pipelstm.LayerNormLSTM`."""

    def __init__(self, model: LayerNormLSTM) -> None:
        super().__init__()
        self.cells = nn.ModuleList()
        with torch.no_grad():
            for k in range(model.num_layers):
                cell = _Cell(model.input_size if k == 0 else model.hidden_size, model.hidden_size).to(model.weight_ih_l0)
                cell.weight_ih.copy_(getattr(model, f"weight_ih_l{k}"))
                cell.weight_hh.copy_(getattr(model, f"weight_hh_l{k}"))
                cell.bias.copy_(getattr(model, f"bias_ih_l{k}") + getattr(model, f"bias_hh_l{k}"))
                cell.norm_ih.weight.copy_(getattr(model, f"layer_norm_ih_weight_l{k}"))
                cell.norm_hh.weight.copy_(getattr(model, f"layer_norm_hh_weight_l{k}"))
                cell.norm_c.weight.copy_(getattr(model, f"layer_norm_c_weight_l{k}"))
                cell.norm_c.bias.copy_(getattr(model, f"layer_norm_c_bias_l{k}"))
                self.cells.append(cell)


def _models(x: torch.Tensor) -> dict:
    H = x.size(-1)
    models = {"plain": LSTM(H, H, num_layers=LAYERS), "layernorm": LayerNormLSTM(H, H, num_layers=LAYERS)}
    models["cell_loop"] = LayerNormCellLoop(models["layernorm"])
    want = models["layernorm"](x)[0]
    torch.testing.assert_close(models["cell_loop"](x)[0], want, atol=2e-3, rtol=0)  # the same model (float32)
    return models


def run(T: int, B: int, H: int, threads: List[int], repeats: int, device: str = "cpu") -> List[dict]:
    return training_step_rows(COLUMNS, threads, (T, B, H), repeats, _models,
                              lambda t: dict(cost=t["layernorm"] / t["plain"], speedup=t["cell_loop"] / t["layernorm"]),
                              device)


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("layernorm", __doc__, threads=(1, 2), repeats=7, quick=report.QUICK)
    p.add_argument("--T", type=int, default=64)
    p.add_argument("--B", type=int, nargs="+", default=[8, 32])
    p.add_argument("--H", type=int, nargs="+", default=[256, 512])
    add_device_argument(p)
    args = report.parse_arguments(p, argv)
    check_device(p, args.device)
    meta = report.metadata("layernorm", argv)
    T, batches, sizes = (6, [2], [8]) if args.quick else (args.T, args.B, args.H)
    print(f"torch {torch.__version__}, float32 {device_label(args.device)}, {LAYERS} layers, forward+backward in "
          f"training, T={T}, median of {args.repeats} interleaved runs")
    print(header(COLUMNS))
    rows = [r for B in batches for H in sizes for r in run(T, B, H, args.threads, args.repeats, args.device)]
    report.write_json(args.json, meta, COLUMNS, rows, notes=[
        f"{LAYERS} layers, I = H. cell_loop: a LayerNorm LSTM cell (torch.mm, three nn.LayerNorm) stepped in Python "
        "per layer, the same weights; its output checked equal to LayerNormLSTM's before timing."])
    return rows
