"""``python -m pipelstm.bench small``: small models, where the cost of a call is more than its arithmetic.

A decoder stepping an ``LSTMCell`` token by token, a policy network's LSTM
over one step, a keyword spotter's 64-unit stack: each call does microseconds
of arithmetic, so what a call costs around its kernels (Python, autograd's
bookkeeping, the dispatcher) decides the time. Each row times
``pipelstm.LSTM`` / ``pipelstm.LSTMCell`` against ``torch.nn.LSTM`` /
``torch.nn.LSTMCell`` with the same weights and input, run alternately:

* ``LSTM``: one call of the module on ``[T, B, H]`` (I = H);
* ``LSTMCell``: ``T`` steps of the cell in a Python loop, each step's ``h``
  fed to the next (as a decoder does), one run the whole loop;

each in ``inference`` (``torch.no_grad()``) and ``training`` (the forward,
then the backward of the outputs' sum). A run is the mean of as many calls
as fill ``--min-run-ms``.
"""

import sys
from typing import Callable, List

import torch
from torch import nn

from ..lstm import LSTM
from ..lstm_cell import LSTMCell
from . import report
from .table import Column, add_row, header
from .timing import add_min_run_argument, interleaved_times, medians

__all__ = ["main"]

COLUMNS = [
    Column("threads", "threads"), Column("module", "module"), Column("layers", "layers"), Column("T", "T"),
    Column("B", "B"), Column("H", "I=H"), Column("mode", "mode"),
    Column("ours", "pipelstm µs", "{:.0f}", 1e6), Column("peer", "torch.nn µs", "{:.0f}", 1e6),
    Column("speedup", "speedup", "{:.2f}x"),
]

# (module, layers, T, B, H)
CASES = [
    ("LSTM", 1, 1, 8, 64), ("LSTM", 2, 1, 8, 64), ("LSTM", 4, 1, 8, 64),
    ("LSTM", 2, 20, 8, 64), ("LSTM", 2, 20, 8, 128), ("LSTM", 2, 20, 32, 128),
    ("LSTMCell", 1, 20, 1, 64), ("LSTMCell", 1, 20, 8, 64), ("LSTMCell", 1, 20, 8, 256),
    ("LSTMCell", 1, 20, 32, 256),
]
QUICK_CASES = [("LSTM", 2, 2, 2, 8), ("LSTMCell", 1, 2, 2, 8)]


def _cell_loop(cell: nn.Module, x: torch.Tensor) -> torch.Tensor:
    state = None
    outputs = []
    for t in range(x.size(0)):
        state = cell(x[t], state)
        outputs.append(state[0])
    return torch.stack(outputs)


def _forward(module: str, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)[0] if module == "LSTM" else _cell_loop(model, x)


def _call(module: str, model: nn.Module, x: torch.Tensor, training: bool) -> Callable[[], None]:
    forward = lambda: _forward(module, model, x)  # noqa: E731
    if training:
        return lambda: forward().sum().backward()

    def inference() -> None:
        with torch.no_grad():
            forward()
    return inference


def _models(module: str, layers: int, H: int):
    torch.manual_seed(0)
    if module == "LSTM":
        peer, ours = nn.LSTM(H, H, layers), LSTM(H, H, layers)
    else:
        peer, ours = nn.LSTMCell(H, H), LSTMCell(H, H)
    ours.load_state_dict(peer.state_dict())
    return ours, peer


def run(cases, threads: List[int], repeats: int, min_run_seconds: float) -> List[dict]:
    rows: List[dict] = []
    for n_threads in threads:
        torch.set_num_threads(n_threads)
        for module, layers, T, B, H in cases:
            ours, peer = _models(module, layers, H)
            x = torch.randn(T, B, H, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():  # the same model on both sides
                torch.testing.assert_close(_forward(module, ours, x), _forward(module, peer, x), atol=1e-5, rtol=1e-5)
            for mode in ("inference", "training"):
                training = mode == "training"
                times = interleaved_times({"ours": _call(module, ours, x, training),
                                           "peer": _call(module, peer, x, training)},
                                          repeats, warmup=2, min_run_seconds=min_run_seconds)
                t = medians(times)
                add_row(rows, COLUMNS, dict(threads=n_threads, module=module, layers=layers, T=T, B=B, H=H,
                                            mode=mode, **t, speedup=t["peer"] / t["ours"], samples=times))
    return rows


def main(argv=None) -> List[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = report.argument_parser("small", __doc__, threads=(1, 2), repeats=7, quick=report.QUICK)
    add_min_run_argument(p)
    args = report.parse_arguments(p, argv)
    meta = report.metadata("small", argv)
    print(f"torch {torch.__version__}, float32 CPU, {report.isa_label()}, median of {args.repeats} interleaved runs "
          f"of at least {args.min_run_ms:g} ms")
    print(header(COLUMNS))
    rows = run(QUICK_CASES if args.quick else CASES, args.threads, args.repeats, args.min_run_ms / 1e3)
    report.write_json(args.json, meta, COLUMNS, rows, notes=[
        "LSTM: one call on [T, B, H]; LSTMCell: T steps in a Python loop, each step's h fed to the next. "
        "inference: under torch.no_grad(); training: forward, then backward of the outputs' sum."])
    return rows
