"""Plain-torch LSTM math, used as the independent reference in tests."""

import contextlib
import math
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor


def cell(gates: Tensor, c_prev: Tensor) -> Tuple[Tensor, Tensor]:
    """One step from gate pre-activations [B, 4H] (order i, f, g, o)."""
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def layer(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor] = None,
          b_hh: Optional[Tensor] = None, w_hr: Optional[Tensor] = None, reverse: bool = False,
          keep_c: Optional[Tensor] = None, keep_h: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """One direction of one layer, step by step: (output, h_n, c_n). With
    zoneout's keep weights keep_c, keep_h [T, B, H], each step's c and h
    are keep * previous + (1 - keep) * new."""
    h, c = h0, c0
    outputs = [None] * x.shape[0]
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    for t in steps:
        gates = x[t] @ w_ih.t() + h @ w_hh.t()
        if b_ih is not None:
            gates = gates + b_ih
        if b_hh is not None:
            gates = gates + b_hh
        new_h, new_c = cell(gates, c)
        if keep_c is not None:
            new_c = keep_c[t] * c + (1 - keep_c[t]) * new_c
            new_h = keep_h[t] * h + (1 - keep_h[t]) * new_h
        h, c = new_h, new_c
        if w_hr is not None:
            h = h @ w_hr.t()
        outputs[t] = h
    return torch.stack(outputs), h, c


def packed_layer(
    data: Tensor,
    batch_sizes,
    h0: Tensor,
    c0: Tensor,
    reverse: bool = False,
    **weights: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor]:
    """layer() over a PackedSequence's rows (``batch_sizes`` a list): each
    sequence run alone, its rows put back in packed order; (output, h_n, c_n)
    with the sequences in sorted order."""
    sizes = list(batch_sizes)
    offsets = [sum(sizes[:t]) for t in range(len(sizes))]
    outs, hs, cs = [], [], []
    for j in range(sizes[0]):
        length = sum(1 for b in sizes if b > j)
        seq = torch.stack([data[offsets[t] + j] for t in range(length)]).unsqueeze(1)
        out, h, c = layer(seq, h0[j : j + 1], c0[j : j + 1], **weights, reverse=reverse)
        outs.append(out[:, 0])
        hs.append(h[0])
        cs.append(c[0])
    rows = [outs[j][t] for t in range(len(sizes)) for j in range(sizes[t])]
    return torch.stack(rows), torch.stack(hs), torch.stack(cs)


def rel_error(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max |expected| (0 when both are 0 or empty)."""
    if expected.numel() == 0:
        return 0.0 if actual.numel() == 0 else math.inf
    scale = expected.detach().abs().max().item()
    err = (actual.detach().to(expected.dtype) - expected.detach()).abs().max().item()
    return err / scale if scale > 0 else err


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Runs the body with `n` intra-op threads (results that compare bitwise
    need the same thread count on both sides)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
