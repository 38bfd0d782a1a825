"""The fused LSTM ops as Python functions.

Their kernels and autograd formulas are registered by pipelstm's C++
extension as ``torch.ops.pipelstm.*``, with fake kernels for
``torch.compile`` and ``torch.export``. Under torch.func transforms and
forward-mode AD these functions run the ops' ATen composition instead, and
a create_graph=True backward differentiates it, so every derivative nn.LSTM
users take is exact (a ``torch.ops.pipelstm.*_forward`` op called directly
under a torch.func transform raises instead: call these functions).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .op_autograd import REDUCED, composed, rounded_from_float32, unwrapped

__all__ = ["lstm_cell", "lstm_layer", "lstm_packed_layer", "lstm_zoneout_layer"]

_ops = torch.ops.pipelstm


def lstm_cell(
    input_gates: Tensor,
    hidden_gates: Tensor,
    cx: Tensor,
    b_ih: Optional[Tensor] = None,
    b_hh: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """One fused LSTM step.

    Args:
        input_gates: ``x @ w_ih.T``, shape ``[B, 4H]``, gate order i, f, g, o.
        hidden_gates: ``h @ w_hh.T``, shape ``[B, 4H]``.
        cx: previous cell state ``[B, H]``.
        b_ih, b_hh: optional biases ``[4H]``.

    Returns:
        ``(hy, cy)``, each ``[B, H]``.
    """
    if composed(input_gates, hidden_gates, cx, b_ih, b_hh):
        return _ops.lstm_cell_composite(input_gates, hidden_gates, cx, b_ih, b_hh)
    hy, cy, _ = _ops.lstm_cell_forward(input_gates, hidden_gates, cx, b_ih, b_hh)
    return hy, cy


def lstm_layer(input: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor] = None,
               b_hh: Optional[Tensor] = None, w_hr: Optional[Tensor] = None,
               reverse: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """One direction of one LSTM layer over a whole sequence.

    Args:
        input: ``[T, B, I]``.
        h0: ``[B, P]`` where ``P`` is the projection size, or ``H`` without one.
        c0: ``[B, H]``.
        w_ih: ``[4H, I]``; w_hh: ``[4H, P]``; b_ih, b_hh: optional ``[4H]``;
        w_hr: optional projection ``[P, H]``.
        reverse: run from the last step to the first.

    Returns:
        ``(output [T, B, P], h_n [B, P], c_n [B, H])``.
    """
    if composed(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr):
        return _ops.lstm_layer_composite(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse)
    output, h_n, c_n, _ = _ops.lstm_layer_forward(
        input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse
    )
    return output, h_n, c_n


def lstm_packed_layer(input: Tensor, batch_sizes: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor,
                      b_ih: Optional[Tensor] = None, b_hh: Optional[Tensor] = None, w_hr: Optional[Tensor] = None,
                      reverse: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`lstm_layer` over the rows of a ``PackedSequence``.

    Args:
        input: ``PackedSequence.data``, ``[rows, I]``: ``batch_sizes[t]`` rows
            per step, sequences sorted by decreasing length.
        batch_sizes: ``PackedSequence.batch_sizes`` (1-D int64, CPU).
        h0, c0: ``[batch_sizes[0], P]`` and ``[batch_sizes[0], H]``.

    Returns:
        ``(output [rows, P], h_n, c_n)``, each sequence's final state taken
        at its own last step. Padding is never computed.
    """
    if composed(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr):
        return _ops.lstm_packed_layer_composite(input, unwrapped(batch_sizes).tolist(), h0, c0, w_ih, w_hh, b_ih,
                                                b_hh, w_hr, reverse)
    output, h_n, c_n, _ = _ops.lstm_packed_layer_forward(
        input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse
    )
    return output, h_n, c_n


def lstm_zoneout_layer(input: Tensor, batch_sizes: Optional[Tensor], h0: Tensor, c0: Tensor, w_ih: Tensor,
                       w_hh: Tensor, b_ih: Optional[Tensor], b_hh: Optional[Tensor], keep_c: Tensor, keep_h: Tensor,
                       reverse: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`lstm_layer` (``batch_sizes`` None) or :func:`lstm_packed_layer`
    under zoneout, without projection: each step's ``c`` and ``h`` are
    ``keep * previous + (1 - keep) * new``, with ``keep_c``/``keep_h`` of the
    output's shape (0/1 masks while training, probabilities in evaluation;
    they are not differentiated).

    A bfloat16 or float16 call on the CPU is computed in float32 on float32
    copies and its results (and gradients) rounded once, as the plain
    layer's are there.

    Returns:
        ``(output, h_n, c_n)`` as :func:`lstm_layer` or :func:`lstm_packed_layer`.
    """
    if composed(input, h0, c0, w_ih, w_hh, b_ih, b_hh):
        sizes = None if batch_sizes is None else unwrapped(batch_sizes).tolist()
        return _ops.lstm_zoneout_layer_composite(input, sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h, reverse)
    if input.device.type == "cpu" and input.dtype in REDUCED:
        return rounded_from_float32(lstm_zoneout_layer, input.dtype, input, batch_sizes, h0, c0, w_ih, w_hh, b_ih,
                                    b_hh, keep_c, keep_h, reverse)
    output, h_n, c_n, _ = _ops.lstm_zoneout_layer_forward(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh,
                                                          keep_c, keep_h, reverse)
    return output, h_n, c_n
