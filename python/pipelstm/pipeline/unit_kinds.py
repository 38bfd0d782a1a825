"""What pipelstm knows of each kind of unit beyond the engine's table
(``_C.pipeline.UNIT_KINDS``): its cost per token for the balancing cost
model and a plain-torch forward for the profiler (``KINDS``), and which
kinds are LSTM layers or dropouts."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Tuple

import torch.nn.functional as F
from torch import Tensor

from .. import _C, ops
from ..geometry import LayerGeometry
from ..layernorm_ops import lstm_layernorm_layer

if TYPE_CHECKING:
    from .units import Unit

__all__ = ["Kind", "KINDS", "LSTM_KINDS", "DROPOUT_KINDS", "slots"]

_engine = _C.pipeline


@dataclass(frozen=True)
class Kind:
    """What pipelstm knows of one kind of unit.

    Args:
        cost: (forward + backward FLOPs per token, bytes saved for backward per token).
        reference: the unit's forward in plain torch.
    """

    cost: Callable[["Unit"], Tuple[float, float]]
    reference: Callable[["Unit"], Callable[[Tensor], Tensor]]


def slots(kind: str) -> Tuple[str, ...]:
    """The kind's parameter slots, as the engine's table names them."""
    return _engine.UNIT_KINDS[kind]["slots"]


def _lstm_cost(u: "Unit") -> Tuple[float, float]:
    g = LayerGeometry(u.input_size, u.hidden_size, u.proj_size)
    H, P, I = g.hidden_size, g.out_size, g.input_size
    fwd = 2 * 4 * H * (I + P) + (2 * P * H if g.projected else 0) + 20 * H
    return 3.0 * fwd, float((I + P + g.workspace_width) * u.element_size())


def _layernorm_lstm_cost(u: "Unit") -> Tuple[float, float]:
    # an LSTM layer's GEMMs, and three normalisations of its 9H values a step
    H, I = u.hidden_size, u.input_size
    fwd = 2 * 4 * H * (I + H) + 60 * H
    return 3.0 * fwd, float((I + 2 * H + 15 * H + 3) * u.element_size())


def _pointwise_cost(u: "Unit") -> Tuple[float, float]:
    width = max(u.out_size, 1)
    return 3.0 * width, float(width * u.element_size())


def _lstm_reference(u: "Unit") -> Callable[[Tensor], Tensor]:
    p = u.params()

    def fn(x: Tensor) -> Tensor:
        B = x.shape[1]
        return ops.lstm_layer(x, x.new_zeros(B, u.out_size), x.new_zeros(B, u.hidden_size), *p)[0]

    return fn


def _layernorm_lstm_reference(u: "Unit") -> Callable[[Tensor], Tensor]:
    w_ih, w_hh, b_ih, b_hh, *norms = u.params()
    bias = b_ih + b_hh if b_ih is not None else None

    def fn(x: Tensor) -> Tensor:
        B = x.shape[1]
        zeros = x.new_zeros(B, u.hidden_size)
        return lstm_layernorm_layer(x, None, zeros, zeros, w_ih, w_hh, bias, *norms, eps=u.options["eps"])[0]

    return fn


def _embedding_reference(u: "Unit") -> Callable[[Tensor], Tensor]:
    weight, m = u.params()[0], u.module
    return lambda x: F.embedding(x, weight, m.padding_idx, None, 2.0, m.scale_grad_by_freq, False)


def _linear_reference(u: "Unit") -> Callable[[Tensor], Tensor]:
    weight, bias = u.params()
    return lambda x: F.linear(x, weight, bias)


DROPOUT_KINDS = ("dropout", "variational_dropout")  # per element; per sequence, at every step and chunk
LSTM_KINDS = ("lstm", "layernorm_lstm")  # the layers of pipelstm.LSTM / nn.LSTM and of pipelstm.LayerNormLSTM

KINDS: Dict[str, Kind] = {
    "lstm": Kind(_lstm_cost, _lstm_reference),
    "layernorm_lstm": Kind(_layernorm_lstm_cost, _layernorm_lstm_reference),
    "embedding": Kind(lambda u: (2.0 * u.out_size, 8.0), _embedding_reference),
    "linear": Kind(lambda u: (3.0 * 2 * u.input_size * u.out_size, float(u.input_size * u.element_size())),
                   _linear_reference),
    "dropout": Kind(_pointwise_cost, lambda u: lambda x: F.dropout(x, u.p, training=True)),
    "variational_dropout": Kind(_pointwise_cost, lambda u: lambda x: x * F.dropout(x.new_ones(x.shape[1:]), u.p)),
    "activation": Kind(_pointwise_cost, lambda u: u.module),
    "layer_norm": Kind(_pointwise_cost, lambda u: u.module),
    "rms_norm": Kind(_pointwise_cost, lambda u: u.module),
}
