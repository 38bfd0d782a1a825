"""``pipelstm.LayerNormLSTMCell``: one step of ``pipelstm.LayerNormLSTM``
with the interface of ``torch.nn.LSTMCell``."""

from typing import Tuple

import torch
from torch import Tensor, nn

from .layernorm_lstm import check_eps, reset_norms
from .layernorm_ops import lstm_layernorm_layer
from .lstm_cell import LSTMCell

__all__ = ["LayerNormLSTMCell"]

_State = Tuple[Tensor, Tensor]


class LayerNormLSTMCell(LSTMCell):
    """One LayerNorm LSTM step (the math of :class:`pipelstm.LayerNormLSTM`).

    Args: ``input_size, hidden_size, bias=True, device=None, dtype=None`` as
    :class:`torch.nn.LSTMCell`, then keyword-only ``eps=1e-5``.
    Parameters: ``nn.LSTMCell``'s, plus ``layer_norm_ih_weight`` and
    ``layer_norm_hh_weight`` ``[4H]``, ``layer_norm_c_weight`` and (with
    ``bias``) ``layer_norm_c_bias`` ``[H]``. Input ``(B, I)`` or unbatched
    ``(I)``, optional ``(h, c)``; returns ``(h', c')``. In float32 and
    float64 (on the CPU, and on CUDA in a CUDA build) a step is the fused
    LayerNorm layer op over one time step.
    """

    _exports_as_nn_lstm_cell = False  # ONNX export traces the composition

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None, *,
                 eps: float = 1e-5) -> None:
        check_eps("LayerNormLSTMCell", eps)
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self.eps = float(eps)
        factory = {"device": device, "dtype": dtype}
        H = hidden_size
        self.layer_norm_ih_weight = nn.Parameter(torch.ones(4 * H, **factory))
        self.layer_norm_hh_weight = nn.Parameter(torch.ones(4 * H, **factory))
        self.layer_norm_c_weight = nn.Parameter(torch.ones(H, **factory))
        self.register_parameter("layer_norm_c_bias", nn.Parameter(torch.zeros(H, **factory)) if bias else None)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        reset_norms(self)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.eps == 1e-5 else f"{s}, eps={self.eps}"

    def __prepare_scriptable__(self) -> nn.Module:
        raise RuntimeError("LayerNormLSTMCell: torch.jit.script would compile torch's nn.LSTMCell, which has no "
                           "LayerNorm; use torch.export or torch.compile")

    def _step(self, input: Tensor, hx: _State) -> _State:
        bias = self.bias_ih + self.bias_hh if self.bias else None
        _, h, c = lstm_layernorm_layer(input.unsqueeze(0), None, hx[0], hx[1], self.weight_ih, self.weight_hh, bias,
                                       self.layer_norm_ih_weight, self.layer_norm_hh_weight, self.layer_norm_c_weight,
                                       self.layer_norm_c_bias, eps=self.eps)
        return h, c
