"""``pipelstm.LayerNormLSTM``: a stacked LSTM with layer normalisation
(Ba et al. 2016, arXiv 1607.06450) of the input and recurrent
pre-activations and of the cell, fused on the CPU (layernorm_ops.py)."""

import math
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from .layernorm_ops import lstm_layernorm_layer
from .lstm import LSTM

__all__ = ["LayerNormLSTM", "check_eps", "reset_norms"]

_NORMS = ("layer_norm_ih_weight", "layer_norm_hh_weight", "layer_norm_c_weight", "layer_norm_c_bias")


def check_eps(who: str, eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{who}: expected `eps` a finite number >= 0, got {eps!r}")


def reset_norms(module: nn.Module) -> None:
    """The norms' gains to 1 and the cell's shift to 0 (after the module's
    uniform initialisation has set every parameter)."""
    with torch.no_grad():
        for name, p in module.named_parameters(recurse=False):
            if name.startswith("layer_norm_"):
                p.fill_(0.0 if name.startswith("layer_norm_c_bias") else 1.0)


class LayerNormLSTM(LSTM):
    """A multi-layer LSTM with LayerNorm on each step's gate pre-activations
    and on its cell::

        a_t = LN_ih(x_t W_ih^T) + LN_hh(h_{t-1} W_hh^T) + b_ih + b_hh
        c_t = sigmoid(f_t) * c_{t-1} + sigmoid(i_t) * tanh(g_t)
        h_t = sigmoid(o_t) * tanh(LN_c(c_t))

    ``LN_ih`` and ``LN_hh`` normalise the 4H pre-activations with a learned
    gain each (the gate biases act as their shift), ``LN_c`` the H cells
    with a gain and, with ``bias``, a shift; as :class:`torch.nn.LayerNorm`
    with ``eps``.

    Args: those of :class:`torch.nn.LSTM` less ``proj_size``
    (``input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, device=None, dtype=None``), then,
    keyword-only, ``eps=1e-5`` and the regularisation of
    :class:`pipelstm.LSTM` (``weight_dropout``, ``dropout_mode``, ``zoneout``).

    Parameters: ``nn.LSTM``'s (same names, shapes and initialisation), and
    per layer and direction ``layer_norm_ih_weight_l{k}`` and
    ``layer_norm_hh_weight_l{k}`` ``[4H]``, ``layer_norm_c_weight_l{k}`` and
    (with ``bias``) ``layer_norm_c_bias_l{k}`` ``[H]``, with ``_reverse``
    for the second direction; gains start at 1, the shift at 0.

    Inputs and outputs: as :class:`torch.nn.LSTM` (padded, ``batch_first``,
    unbatched or a ``PackedSequence``; ``(h_0, c_0)`` optional).

    On the CPU and (in a CUDA build) on CUDA, each layer direction is one
    fused op, in float32 and float64, and in bfloat16 and float16 computed
    in float32 with its results rounded once; under torch.func transforms,
    forward-mode AD and ONNX export it is a composition of torch ops, a step
    at a time. In a ``Pipeline`` or ``PipelineParallel`` each layer is a
    unit on its stage (float32 or float64). ``torch.jit.script`` and
    ``devices=`` are not supported.
    """

    _exports_as_nn_lstm = False  # ONNX export traces the composition
    _pipeline_unit_kind = "layernorm_lstm"  # a pipeline's units for its layers (pipeline/units.py)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, device=None,
                 dtype=None, *, eps: float = 1e-5, weight_dropout: float = 0.0, dropout_mode: str = "element",
                 zoneout: Union[float, Tuple[float, float]] = 0.0) -> None:
        check_eps("LayerNormLSTM", eps)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0, device,
                         dtype, weight_dropout=weight_dropout, dropout_mode=dropout_mode, zoneout=zoneout)
        self.eps = float(eps)
        factory = {"device": device, "dtype": dtype}
        H = hidden_size
        for layer in range(num_layers):
            for sfx in ("", "_reverse")[: 2 if bidirectional else 1]:
                self.register_parameter(f"layer_norm_ih_weight_l{layer}{sfx}", nn.Parameter(torch.ones(4 * H, **factory)))
                self.register_parameter(f"layer_norm_hh_weight_l{layer}{sfx}", nn.Parameter(torch.ones(4 * H, **factory)))
                self.register_parameter(f"layer_norm_c_weight_l{layer}{sfx}", nn.Parameter(torch.ones(H, **factory)))
                if bias:
                    self.register_parameter(f"layer_norm_c_bias_l{layer}{sfx}", nn.Parameter(torch.zeros(H, **factory)))

    def reset_parameters(self) -> None:
        super().reset_parameters()  # nn.LSTM's uniform initialisation, then the norms' own
        reset_norms(self)

    def flatten_parameters(self) -> None:
        pass  # cuDNN never runs a LayerNorm LSTM

    def _require_plain_recurrence(self, what: str) -> None:
        raise RuntimeError(f"LayerNormLSTM: {what} would run torch's nn.LSTM, which has no LayerNorm; use "
                           "torch.export or torch.compile")

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.eps == 1e-5 else f"{s}, eps={self.eps}"

    def _norm_weights(self, layer: int, reverse: bool) -> List[Optional[Tensor]]:
        """[gamma_ih, gamma_hh, gamma_c, beta_c] of one layer and direction, by name each call."""
        sfx = f"_l{layer}" + ("_reverse" if reverse else "")
        return [getattr(self, name + sfx, None) for name in _NORMS]

    def _stack_weights(self) -> List[Tensor]:
        norms = [w for layer in range(self.num_layers) for reverse in (False, True)[: 2 if self.bidirectional else 1]
                 for w in self._norm_weights(layer, reverse) if w is not None]
        return super()._stack_weights() + norms

    def _run_layers(self, data: Tensor, batch_sizes: Optional[Tensor],
                    hx: Tuple[Tensor, Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        return self._layers(data, batch_sizes, hx[0], hx[1], 0)  # layer after layer, no CUDA strategies

    def _direction(self, x: Tensor, batch_sizes: Optional[Tensor], h0: Tensor, c0: Tensor, layer: int,
                   reverse: bool) -> Tuple[Tensor, Tensor, Tensor]:
        w_ih, w_hh, b_ih, b_hh, _ = self._regularisation.layer_weights(self._layer_weights(layer, reverse),
                                                                       self.training)
        keep = (None, None)
        if self._regularisation.zoned:
            keep = self._regularisation.keep_weights((*x.shape[:-1], self.hidden_size), self.training, x)
        bias = b_ih + b_hh if b_ih is not None else None
        return lstm_layernorm_layer(x, batch_sizes, h0, c0, w_ih, w_hh, bias, *self._norm_weights(layer, reverse),
                                    *keep, reverse=reverse, eps=self.eps)
