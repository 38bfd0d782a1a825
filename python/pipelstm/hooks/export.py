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
ONNX's ``LSTM`` op has no projection and torch's translation of ``aten::lstm``
drops it (for nn.LSTM it writes a graph onnxruntime refuses to load). There
pipelstm traces torch's own decomposition of ``aten::lstm`` instead (one
step after another in ATen ops, projection included), which the dynamo
exporter's fixed sequence length allows. The TorchScript exporter keeps
nn.LSTM's error ("Unsupported: ONNX export of operator LSTM, LSTMs with
projections"): its graphs take any sequence length, an unrolled one would not.

``torch.export.export`` (and so AOTInductor) is not an ONNX export: there the
modules keep their fused ops, which trace through their fake kernels.

``torch.jit.script`` cannot compile the modules' Python: it gets torch's
``nn.LSTM`` / ``nn.LSTMCell`` in their place (``as_torch_module``), holding
the same parameter tensors, so that a model holding them scripts as a model
of torch's modules does. torch puts what that hook returns into the
scripted model's own tree too, so from then on the model holds torch's
modules (same parameters, same results, torch's speed); a warning says so.
``torch.jit.trace`` records the fused ops and leaves the model as it is.
"""

import warnings

from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch._decomp.decompositions import lstm_impl
from torch.nn.utils.rnn import PackedSequence
from torch.overrides import TorchFunctionMode

__all__ = ["in_onnx_export", "lstm_forward", "lstm_cell_forward", "as_torch_module"]

_State = Tuple[Tensor, Tensor]

# torch's own classes, from the module that defines them: a script may set
# torch.nn.LSTM = pipelstm.LSTM (to swap the class inside code it does not
# own), and then torch.nn.LSTM.forward would be pipelstm's again.
TorchLSTM = torch.nn.modules.rnn.LSTM
TorchLSTMCell = torch.nn.modules.rnn.LSTMCell


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

    With ``proj_size > 0`` under the dynamo exporter, torch's decomposition
    of ``aten::lstm`` stands in for the op (see the module's docstring).

    Args:
        lstm: a ``pipelstm.LSTM``.
        input, hx: as ``torch.nn.LSTM.forward``.

    Returns:
        ``output, (h_n, c_n)`` as ``torch.nn.LSTM.forward``.

    Raises:
        What ``torch.nn.LSTM.forward`` raises under the same exporter, as it raises it.
    """
    if lstm.proj_size > 0 and torch.compiler.is_exporting():
        with _DecomposedLSTM():
            return TorchLSTM.forward(lstm, input, hx)
    return TorchLSTM.forward(lstm, input, hx)


class _DecomposedLSTM(TorchFunctionMode):
    """Calls of ``torch.lstm`` on a padded batch run torch's decomposition of ``aten::lstm.input``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.lstm and not kwargs and len(args) == 9:  # lstm.input; lstm.data (packed) has 10
            return lstm_impl(*args)
        return func(*args, **kwargs)


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
    return TorchLSTMCell.forward(cell, input, hx)


def as_torch_module(module: nn.Module) -> nn.Module:
    """torch's ``nn.LSTM`` (or ``nn.LSTMCell``) for a ``pipelstm.LSTM`` (or
    ``LSTMCell``): the same arguments, holding the same parameter tensors
    (shared, not copied), in the same training mode. What
    ``torch.jit.script`` compiles in place of a pipelstm module.

    Raises:
        RuntimeError: an LSTM pipelined over devices (``devices=[...]``),
            whose layers live on several devices.
    """
    if getattr(module, "devices", None) is not None:
        raise RuntimeError("LSTM: torch.jit.script of an LSTM pipelined over devices=[...] is not supported; "
                           "script it without devices=, or use torch.compile / torch.export")
    param = next(module.parameters())
    if isinstance(module, nn.RNNBase):
        twin = TorchLSTM(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first,
                         module.dropout, module.bidirectional, module.proj_size, device="meta", dtype=param.dtype)
    else:
        twin = TorchLSTMCell(module.input_size, module.hidden_size, module.bias, device="meta", dtype=param.dtype)
    for name, p in module.named_parameters():
        setattr(twin, name, p)  # nn.RNNBase's __setattr__ keeps its _flat_weights in step
    warnings.warn(f"pipelstm: torch.jit.script compiles torch's {type(twin).__name__} in place of pipelstm's, and "
                  f"torch swaps it into the model it scripts: the model now holds torch's module (the same "
                  f"parameters). torch.jit.trace, torch.compile and torch.export keep pipelstm's", stacklevel=4)
    return twin.train(module.training)
