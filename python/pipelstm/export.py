"""What ``pipelstm.LSTM`` and ``pipelstm.LSTMCell`` compute under ``torch.onnx.export``.

ONNX has no form for the fused pipelstm ops, but it has one for
``torch.nn.LSTM``: both exporters turn torch's own LSTM function
(``torch._VF.lstm``, ``aten::lstm``) into the ONNX ``LSTM`` op, and
``aten::lstm_cell`` into ONNX's elementwise ops. The parameters of
``pipelstm.LSTM`` are exactly those of ``torch.nn.LSTM`` (names, shapes,
order, ``_flat_weights``), so during an ONNX export the modules run
``torch.nn.LSTM.forward`` / ``torch.nn.LSTMCell.forward`` on themselves: the
exported graph, its results and its errors are nn.LSTM's.

The one departure: an LSTM with ``proj_size > 0`` under the dynamo exporter.
ONNX's ``LSTM`` op has no projection; the TorchScript exporter refuses it for
nn.LSTM ("Unsupported: ONNX export of operator LSTM, LSTMs with projections"),
which pipelstm inherits, while the dynamo exporter writes a graph for nn.LSTM
that drops the projection and that onnxruntime refuses to load. pipelstm
refuses it at export time instead.

``torch.export.export`` (and so AOTInductor) is not an ONNX export: there the
modules keep their fused ops, which trace through their fake kernels.
"""

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

__all__ = ["in_onnx_export", "lstm_forward", "lstm_cell_forward"]

_State = Tuple[Tensor, Tensor]


def in_onnx_export() -> bool:
    """Whether this call is being traced by ``torch.onnx.export`` (either exporter).

    ``torch.onnx.is_in_onnx_export()`` alone, asked on every forward, would
    import two modules each time; the dynamo exporter runs under
    ``torch.export`` and the TorchScript one under ``torch.jit`` tracing, so
    those two cheap flags are asked first. ``torch.compile`` traces all three
    without a graph break.
    """
    return (torch.compiler.is_exporting() or torch.jit.is_tracing()) and torch.onnx.is_in_onnx_export()


def lstm_forward(
    lstm: nn.RNNBase, input: Union[Tensor, PackedSequence], hx: Optional[_State] = None
) -> Tuple[Union[Tensor, PackedSequence], _State]:
    """``pipelstm.LSTM.forward`` during ``torch.onnx.export``: ``torch.nn.LSTM.forward``.

    Args:
        lstm: a ``pipelstm.LSTM``.
        input, hx: as ``torch.nn.LSTM.forward``.

    Returns:
        ``output, (h_n, c_n)`` as ``torch.nn.LSTM.forward``.

    Raises:
        RuntimeError: ``lstm.proj_size > 0`` under the dynamo exporter (ONNX's
            LSTM op has no projection). Everything else nn.LSTM raises, as it
            raises it.
    """
    if lstm.proj_size > 0 and torch.compiler.is_exporting():
        raise RuntimeError(
            f"LSTM: an LSTM with proj_size={lstm.proj_size} has no ONNX form: ONNX's LSTM op has no projection "
            "(torch.onnx.export(dynamo=True) of a torch.nn.LSTM with a projection writes a graph without it, which "
            "onnxruntime refuses to load; the TorchScript exporter raises 'Unsupported: ONNX export of operator "
            "LSTM, LSTMs with projections'). Export with proj_size=0, or deploy with torch.export and AOTInductor, "
            "which keep the projection"
        )
    return nn.LSTM.forward(lstm, input, hx)


def lstm_cell_forward(cell: nn.RNNCellBase, input: Tensor, hx: Optional[_State] = None) -> _State:
    """``pipelstm.LSTMCell.forward`` during ``torch.onnx.export``: ``torch.nn.LSTMCell.forward``.

    Args:
        cell: a ``pipelstm.LSTMCell``.
        input, hx: as ``torch.nn.LSTMCell.forward``.

    Returns:
        ``(h', c')`` as ``torch.nn.LSTMCell.forward``.

    Raises:
        What ``torch.nn.LSTMCell.forward`` raises, as it raises it.
    """
    return nn.LSTMCell.forward(cell, input, hx)
