"""The fused LSTM ops: typed wrappers and autograd formulas.

The kernels themselves are C++ (``torch.ops.pipelstm.*``, registered by
``pipelstm._C``). This module adds what training needs on top: the typed
wrappers and autograd formulas whose backward is itself a pipelstm op (the
fake kernels for tracing are in hooks/fake_kernels.py).
Under torch.func transforms, forward-mode AD and create_graph=True the ops
run on (or differentiate) their ATen composition instead, so every
derivative nn.LSTM users take is exact.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .op_autograd import REDUCED, composed, composed_backward, gradient_is_differentiated, no_double_backward, \
    no_zero_fill_for_unused_outputs, rounded_from_float32, unwrapped

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
        raise RuntimeError("pipelstm: zoneout has no torch.func transform or forward-mode AD yet (its fused op has a "
                           "reverse-mode formula only); use zoneout=0 under torch.func")
    if input.device.type == "cpu" and input.dtype in REDUCED:
        return rounded_from_float32(lstm_zoneout_layer, input.dtype, input, batch_sizes, h0, c0, w_ih, w_hh, b_ih,
                                    b_hh, keep_c, keep_h, reverse)
    output, h_n, c_n, _ = _ops.lstm_zoneout_layer_forward(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh,
                                                          keep_c, keep_h, reverse)
    return output, h_n, c_n


# --- autograd ----------------------------------------------------------------


def _cell_setup_context(ctx, inputs, output):
    _, _, cx, b_ih, b_hh = inputs
    _, cy, workspace = output
    no_zero_fill_for_unused_outputs(ctx, workspace)
    input_gates, hidden_gates = inputs[:2]
    ctx.save_for_backward(cx, cy, workspace, input_gates, hidden_gates, b_ih, b_hh)
    ctx.has_b_ih = b_ih is not None
    ctx.has_b_hh = b_hh is not None


def _cell_backward(ctx, grad_hy, grad_cy, _grad_workspace):
    cx, cy, workspace, input_gates, hidden_gates, b_ih, b_hh = ctx.saved_tensors
    if gradient_is_differentiated():
        return composed_backward(ctx, _ops.lstm_cell_composite, (input_gates, hidden_gates, cx, b_ih, b_hh),
                                  (grad_hy, grad_cy))
    # A bfloat16/float16 call on the CPU gets float32 gradients: the bias
    # gradient is summed from them, then each is rounded to cx's dtype once.
    grad_gates, grad_cx = _ops.lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace)
    grad_bias = grad_gates.sum(0).to(cx.dtype) if ctx.has_b_ih or ctx.has_b_hh else None
    grad_gates = grad_gates.to(cx.dtype)
    return (
        grad_gates,
        grad_gates,
        grad_cx.to(cx.dtype),
        grad_bias if ctx.has_b_ih else None,
        grad_bias if ctx.has_b_hh else None,
    )



def _layer_setup_context(ctx, inputs, output):
    *inputs, reverse = inputs
    packed = len(inputs) == 9  # the packed op has batch_sizes after input
    batch_sizes = inputs.pop(1) if packed else None
    input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = inputs
    out, _, _, workspace = output
    no_zero_fill_for_unused_outputs(ctx, workspace)
    ctx.save_for_backward(input, h0, c0, w_ih, w_hh, w_hr, out, workspace, b_ih, b_hh)
    ctx.batch_sizes = batch_sizes
    ctx.reverse = reverse
    ctx.has_b_ih = b_ih is not None
    ctx.has_b_hh = b_hh is not None


def _layer_backward(ctx, grad_output, grad_h_n, grad_c_n, _grad_workspace):
    input, h0, c0, w_ih, w_hh, w_hr, out, workspace, b_ih, b_hh = ctx.saved_tensors
    if gradient_is_differentiated():
        weights = (w_ih, w_hh, b_ih, b_hh, w_hr)
        if ctx.batch_sizes is None:
            composite = lambda *a: _ops.lstm_layer_composite(*a, ctx.reverse)  # noqa: E731
        else:
            composite = lambda x, *a: _ops.lstm_packed_layer_composite(x, ctx.batch_sizes.tolist(), *a, ctx.reverse)  # noqa: E731
        return composed_backward(ctx, composite, (input, h0, c0, *weights), (grad_output, grad_h_n, grad_c_n),
                                  skip=None if ctx.batch_sizes is None else 1)
    if ctx.batch_sizes is None:
        grads = _ops.lstm_layer_backward(
            grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, w_hr, out, workspace, ctx.reverse
        )
    else:
        grads = _ops.lstm_packed_layer_backward(
            grad_output, grad_h_n, grad_c_n, input, ctx.batch_sizes, h0, c0, w_ih, w_hh, w_hr, out, workspace,
            ctx.reverse,
        )
    grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias, grad_w_hr = grads
    return (
        grad_input,
        *((None,) if ctx.batch_sizes is not None else ()),
        grad_h0,
        grad_c0,
        grad_w_ih,
        grad_w_hh,
        grad_bias if ctx.has_b_ih else None,
        grad_bias if ctx.has_b_hh else None,
        grad_w_hr if w_hr is not None else None,
        None,
    )



def _zoneout_setup_context(ctx, inputs, output):
    input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h, reverse = inputs
    out, _, _, workspace = output
    no_zero_fill_for_unused_outputs(ctx, workspace)
    ctx.save_for_backward(input, h0, c0, w_ih, w_hh, keep_c, keep_h, out, workspace)
    ctx.batch_sizes = batch_sizes
    ctx.reverse = reverse
    ctx.has_b_ih = b_ih is not None
    ctx.has_b_hh = b_hh is not None


def _zoneout_backward(ctx, grad_output, grad_h_n, grad_c_n, _grad_workspace):
    if gradient_is_differentiated():
        raise RuntimeError("pipelstm: double backward (create_graph=True) through zoneout is not supported yet")
    input, h0, c0, w_ih, w_hh, keep_c, keep_h, out, workspace = ctx.saved_tensors
    grad_input, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias = _ops.lstm_zoneout_layer_backward(
        grad_output, grad_h_n, grad_c_n, input, ctx.batch_sizes, h0, c0, w_ih, w_hh, keep_c, keep_h, out,
        workspace, ctx.reverse)
    return (grad_input, None, grad_h0, grad_c0, grad_w_ih, grad_w_hh, grad_bias if ctx.has_b_ih else None,
            grad_bias if ctx.has_b_hh else None, None, None, None)


_registered = False


def register() -> None:
    """Registers the ops' autograd formulas with torch.library (pipelstm's
    import does, once)."""
    global _registered
    if _registered:
        return
    torch.library.register_autograd("pipelstm::lstm_cell_forward", _cell_backward,
                                    setup_context=_cell_setup_context)
    for name in ("pipelstm::lstm_layer_forward", "pipelstm::lstm_packed_layer_forward"):
        torch.library.register_autograd(name, _layer_backward, setup_context=_layer_setup_context)
    torch.library.register_autograd("pipelstm::lstm_zoneout_layer_forward", _zoneout_backward,
                                    setup_context=_zoneout_setup_context)
    for name in ("lstm_cell_backward", "lstm_layer_backward", "lstm_packed_layer_backward",
                 "lstm_zoneout_layer_backward"):
        torch.library.register_autograd(f"pipelstm::{name}", no_double_backward,
                                        setup_context=lambda ctx, inputs, output: None)
    _registered = True
