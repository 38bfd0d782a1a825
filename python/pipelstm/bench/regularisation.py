"""``python -m pipelstm.bench regularisation``: what weight dropout and variational dropout cost.

A 3-layer stack (AWD-LSTM's depth), forward + backward, in training mode,
on the CPU (or ``--device cuda``), each side with the same weights and input,
run alternately:

* ``plain``: ``pipelstm.LSTM`` with ``nn.LSTM``'s dropout between layers;
* ``weight``: with ``weight_dropout`` (DropConnect on ``weight_hh``);
* ``variational``: with ``dropout_mode="variational"``;
* ``both``: the two together, as AWD-LSTM trains;
* ``zoneout``: with ``zoneout=(p_c, p_h)`` (and ``nn.LSTM``'s dropout);
* ``cell_loop``: zoneout as users write it today: a Python loop over
  ``nn.LSTMCell`` per layer, blending each step's state with the previous
  one by masks drawn per step (as fairseq's ``LSTMCellWithZoneOut``);
* ``peer``: what a user writes today: ``nn.LSTM`` with a weight-drop
  wrapper (the raw weight kept as a parameter of its own, the dropped copy
  set on the module before each forward, as fastai's ``WeightDropout``).

A row gives each side's median time, the overheads (weight, variational,
both over plain: the cost of the options) and ``peer / both`` (> 1: the
fused options faster than the wrapper), ``zoneout / plain`` and
``cell_loop / zoneout`` (> 1: the fused zoneout faster than the loop).
"""

import sys
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from ..lstm import LSTM
from . import report
from .table import Column, header
from .cell_loop import CellLoop
from .timing import add_device_argument, check_device, device_label, training_step_rows

__all__ = ["WeightDropLSTM", "main"]

COLUMNS = [
    Column("threads", "threads"), Column("T", "T"), Column("B", "B"), Column("H", "I=H"),
    Column("plain", "plain ms", "{:.1f}", 1e3), Column("weight", "weight_dropout ms", "{:.1f}", 1e3),
    Column("variational", "variational ms", "{:.1f}", 1e3), Column("both", "both ms", "{:.1f}", 1e3),
    Column("peer", "nn.LSTM + weight drop ms", "{:.1f}", 1e3),
    Column("weight_cost", "weight / plain", "{:.3f}x"), Column("variational_cost", "variational / plain", "{:.3f}x"),
    Column("both_cost", "both / plain", "{:.3f}x"), Column("speedup", "peer / both", "{:.2f}x"),
    Column("zoneout", "zoneout ms", "{:.1f}", 1e3), Column("cell_loop", "LSTMCell loop ms", "{:.1f}", 1e3),
    Column("zoneout_cost", "zoneout / plain", "{:.3f}x"), Column("zoneout_speedup", "loop / zoneout", "{:.1f}x"),
]
LAYERS, P_WEIGHT, P_BETWEEN, ZONEOUT = 3, 0.5, 0.3, (0.5, 0.05)


class WeightDropLSTM(nn.Module):
    """``nn.LSTM`` with DropConnect on ``weight_hh`` the way users add it to
    torch's module: each ``weight_hh_l{k}`` is re-registered as a raw
    parameter, and a dropped copy is set on the module before each forward
    (``nn.RNNBase.__setattr__`` keeps its flat weights in step)."""

    def __init__(self, lstm: nn.LSTM, p: float) -> None:
        super().__init__()
        self.lstm, self.p = lstm, p
        self.names = [n for n, _ in lstm.named_parameters() if n.startswith("weight_hh")]
        for name in self.names:
            raw = getattr(lstm, name)
            del lstm._parameters[name]
            self.register_parameter(name + "_raw", nn.Parameter(raw.detach().clone()))
            setattr(lstm, name, raw.detach().clone())

    def forward(self, x):
        for name in self.names:
            raw = getattr(self, name + "_raw")
            # In evaluation a view: the parameter itself would be registered on the LSTM again.
            setattr(self.lstm, name, F.dropout(raw, p=self.p) if self.training else raw.view_as(raw))
        return self.lstm(x)


class ZoneoutCellLoop(CellLoop):
    """Zoneout the way users write it without a fused layer: per layer an
    ``nn.LSTMCell`` stepped in Python, each step's (h, c) blended with the
    previous ones by masks drawn per step, dropout between layers."""

    def __init__(self, lstm: nn.LSTM, zoneout) -> None:
        super().__init__()
        self.cells = nn.ModuleList()
        for layer in range(lstm.num_layers):
            cell = nn.LSTMCell(lstm.input_size if layer == 0 else lstm.hidden_size, lstm.hidden_size)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, name).data.copy_(getattr(lstm, f"{name}_l{layer}"))
            self.cells.append(cell)
        self.p_c, self.p_h = zoneout
        self.dropout = lstm.dropout

    def step(self, cell, x, state):
        h, c = state
        new_h, new_c = cell(x, state)
        keep_c = torch.rand_like(c).lt_(self.p_c).to(c.dtype)
        keep_h = torch.rand_like(h).lt_(self.p_h).to(h.dtype)
        return keep_h * h + (1 - keep_h) * new_h, keep_c * c + (1 - keep_c) * new_c


def _models(x: torch.Tensor) -> dict:
    H = x.size(-1)
    base = nn.LSTM(H, H, num_layers=LAYERS, dropout=P_BETWEEN)
    options = dict(plain={}, weight=dict(weight_dropout=P_WEIGHT), variational=dict(dropout_mode="variational"),
                   both=dict(weight_dropout=P_WEIGHT, dropout_mode="variational"), zoneout=dict(zoneout=ZONEOUT))
    models = {}
    for name, kw in options.items():
        models[name] = LSTM(H, H, num_layers=LAYERS, dropout=P_BETWEEN, **kw)
        models[name].load_state_dict(base.state_dict())
    peer = nn.LSTM(H, H, num_layers=LAYERS, dropout=P_BETWEEN)
    peer.load_state_dict(base.state_dict())
    models["peer"] = WeightDropLSTM(peer, P_WEIGHT)
    models["cell_loop"] = ZoneoutCellLoop(base, ZONEOUT)
    return models


def _ratios(t: dict) -> dict:
    return dict(weight_cost=t["weight"] / t["plain"], variational_cost=t["variational"] / t["plain"],
                both_cost=t["both"] / t["plain"], speedup=t["peer"] / t["both"], zoneout_cost=t["zoneout"] / t["plain"],
                zoneout_speedup=t["cell_loop"] / t["zoneout"])


def run(T: int, B: int, H: int, threads: List[int], repeats: int, device: str = "cpu") -> List[dict]:
    return training_step_rows(COLUMNS, threads, (T, B, H), repeats, _models, _ratios, device)


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("regularisation", __doc__, threads=(1, 2), repeats=7, quick=report.QUICK)
    p.add_argument("--T", type=int, default=64)
    p.add_argument("--B", type=int, default=32)
    p.add_argument("--H", type=int, nargs="+", default=[256, 512, 1024])
    add_device_argument(p)
    args = report.parse_arguments(p, argv)
    check_device(p, args.device)
    meta = report.metadata("regularisation", argv)
    T, B, sizes = (6, 2, [8]) if args.quick else (args.T, args.B, args.H)
    print(f"torch {torch.__version__}, float32 {device_label(args.device)}, {LAYERS} layers, forward+backward in "
          f"training, T={T} B={B}, weight_dropout={P_WEIGHT}, dropout={P_BETWEEN}, median of {args.repeats} "
          f"interleaved runs, zoneout={ZONEOUT}")
    print(header(COLUMNS))
    rows = [r for H in sizes for r in run(T, B, H, args.threads, args.repeats, args.device)]
    report.write_json(args.json, meta, COLUMNS, rows, notes=[
        f"{LAYERS} layers, I = H, dropout {P_BETWEEN} between layers, weight_dropout {P_WEIGHT}. peer: nn.LSTM "
        "with the weight-drop wrapper users write (the dropped weight_hh set on the module before each forward). "
        f"zoneout={ZONEOUT} (p_c, p_h); cell_loop: nn.LSTMCell stepped in Python with zoneout masks per step."])
    return rows
