"""``pipelstm.LSTMCell``: a drop-in ``torch.nn.LSTMCell``.

It takes the same arguments, creates the same parameters and accepts the
same inputs as ``torch.nn.LSTMCell``, refuses bad input with its exception
types and messages, and computes one step with the fused cell op
(``pipelstm.ops.lstm_cell``) after the two input GEMMs.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import ops
from .hooks import export
from .input_checks import check_state_pair

__all__ = ["LSTMCell"]

_State = Tuple[Tensor, Tensor]


class LSTMCell(nn.RNNCellBase):
    """One LSTM step with the interface of :class:`torch.nn.LSTMCell`.

    Args: ``input_size, hidden_size, bias=True, device=None, dtype=None``.
    Input ``(B, I)`` or unbatched ``(I)``, optional ``(h, c)``; returns
    ``(h', c')``.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    _exports_as_nn_lstm_cell = True  # ONNX export runs nn.LSTMCell's own path on these parameters

    def forward(self, input: Tensor, hx: Optional[_State] = None) -> _State:
        if export.in_onnx_export() and self._exports_as_nn_lstm_cell:  # ONNX has no form for the fused op
            return export.lstm_cell_forward(self, input, hx)
        if input.dim() not in (1, 2):
            raise ValueError(f"LSTMCell: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if hx is not None:
            check_state_pair("LSTMCell", hx, "(h, c)")
            for idx, value in enumerate(hx):
                if value.dim() not in (1, 2):
                    raise ValueError(f"LSTMCell: Expected hx[{idx}] to be 1D or 2D, got {value.dim()}D instead")
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)
        if hx is None:
            zeros = torch.zeros(input.size(0), self.hidden_size, dtype=input.dtype, device=input.device)
            hx = (zeros, zeros)
        elif not is_batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        self._check_sizes(input, hx)
        h, c = self._step(input, hx)
        if not is_batched:
            h, c = h.squeeze(0), c.squeeze(0)
        return h, c

    def _step(self, input: Tensor, hx: _State) -> _State:
        """One step of batched input [B, I] from hx ([B, H] each)."""
        gates_i = F.linear(input, self.weight_ih)
        gates_h = F.linear(hx[0], self.weight_hh)
        return ops.lstm_cell(gates_i, gates_h, hx[1], self.bias_ih, self.bias_hh)

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script compiles torch's nn.LSTMCell on these parameters.
        return export.as_torch_module(self)

    def _check_sizes(self, input: Tensor, hx: _State) -> None:
        if input.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} expected {self.input_size}")
        for idx, value in enumerate(hx):
            if value.size(0) != input.size(0):
                raise RuntimeError(
                    f"Input batch size {input.size(0)} doesn't match hidden{idx} batch size {value.size(0)}"
                )
            if value.size(1) != self.hidden_size:
                raise RuntimeError(f"hidden{idx} has inconsistent hidden_size: got {value.size(1)}, expected {self.hidden_size}")
