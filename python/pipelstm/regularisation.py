"""The regularisation of ``pipelstm.LSTM`` beyond ``nn.LSTM``'s dropout.

* ``weight_dropout=p``: DropConnect on each layer's recurrent weights
  ``weight_hh`` (AWD-LSTM, Merity et al. 2017): while training, each
  forward call draws one mask per layer and direction, keeps each weight
  with probability ``1 - p`` and scales the kept ones by ``1 / (1 - p)``;
  the steps of the call all use that one dropped matrix. The parameter is
  untouched (its name and ``state_dict`` are ``nn.LSTM``'s); its gradient
  is the dropped matrix's, masked and scaled.
* ``dropout_mode="variational"``: the ``dropout`` between two layers draws
  one mask per sequence (``[B, features]``) and applies it at every step
  (Gal & Ghahramani 2016), where ``"element"`` (``nn.LSTM``'s, the
  default) draws one per element.

* ``zoneout=(p_c, p_h)`` (or one ``p`` for both): zoneout (Krueger et al.
  2016): while training, each unit of each step's cell and hidden state
  keeps its previous value with probability ``p_c`` (``p_h``), drawn per
  element and step; in evaluation each is the expectation,
  ``p * previous + (1 - p) * new``. Applied inside the step kernels
  (``pipelstm::lstm_zoneout_layer_forward``); not with ``proj_size``.

Masks come from torch's generator (``torch.manual_seed`` reproduces a run)
and are part of the autograd graph: the backward reads the ones the forward
drew. In evaluation mode the dropouts are off: the expectation of the dropped
weights is the weights, and of the masks one.
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _C

__all__ = ["DROPOUT_MODES", "Regularisation", "weight_mask", "sequence_mask", "zoneout_mask", "unit_seed"]

DROPOUT_MODES = ("element", "variational")


def _drawn_on_cpu(shape, p: float, below: float, above: float, like: Tensor, seed: Optional[int] = None) -> Tensor:
    """``below`` with probability ``p``, else ``above``, in ``like``'s dtype:
    drawn by every intra-op thread (``pipelstm::bernoulli_mask``) from
    ``seed``, else from a seed torch's generator draws; torch.rand's
    Mersenne Twister is serial."""
    seed = torch.randint(0, 2**62, (), dtype=torch.int64) if seed is None else torch.tensor(seed, dtype=torch.int64)
    return torch.ops.pipelstm.bernoulli_mask(seed, list(shape), p, below, above, like.dtype)


def _mask(shape, p: float, like: Tensor, seed: Optional[int] = None) -> Tensor:
    """0 with probability ``p``, else ``1 / (1 - p)``, in ``like``'s dtype and
    device, drawn from ``seed`` or else torch's generator. From
    float32-resolution uniforms compared with ``p`` (a 16-bit uniform would
    round ``p``)."""
    if like.device.type == "cpu":
        return _drawn_on_cpu(shape, p, 0.0, 1.0 / (1.0 - p), like, seed)
    gen = None if seed is None else torch.Generator(device=like.device).manual_seed(seed)
    keep = torch.rand(shape, dtype=torch.float32, device=like.device, generator=gen).ge_(p)
    return keep.to(like.dtype).div_(1.0 - p)


def weight_mask(weight: Tensor, p: float, seed: Optional[int] = None) -> Tensor:
    """A DropConnect mask for ``weight``: 0 with probability ``p``, else
    ``1 / (1 - p)``; drawn from ``seed`` (a pipeline's, ``unit_seed``) or
    else torch's generator."""
    return _mask(weight.shape, p, weight, seed)


def unit_seed(pass_seed: Optional[int], unit: int) -> Optional[int]:
    """The seed of the weight masks of unit ``unit`` (its index in the whole
    pipelined model) in a pass drawn from ``pass_seed`` (None: not
    training): the engine's seed of that unit's masks once a pass (item
    (-1, -1), which no item is), so that every unit draws its own stream
    whichever process holds it; within 62 bits, a seed tensor's range."""
    if pass_seed is None:
        return None
    return _C.pipeline.dropout_seed(pass_seed, unit, -1, -1) % 2**62


def sequence_mask(batch: int, features: int, p: float, like: Tensor) -> Tensor:
    """A variational dropout mask ``[batch, features]`` (one per sequence),
    in ``like``'s dtype and device: 0 with probability ``p``, else ``1 / (1 - p)``."""
    return _mask((batch, features), p, like)


def zoneout_mask(shape: Sequence[int], p: float, like: Tensor) -> Tensor:
    """Zoneout's keep weights for a training step: 1 (the previous value
    kept) with probability ``p``, else 0, in ``like``'s dtype and device."""
    if like.device.type == "cpu":
        return _drawn_on_cpu(shape, p, 1.0, 0.0, like)
    return torch.rand(tuple(shape), dtype=torch.float32, device=like.device).lt_(p).to(like.dtype)


def _probability(name: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"LSTM: {name} must be a probability in [0, 1), got {p!r}")
    return float(p)


def _zoneout_pair(zoneout) -> Tuple[float, float]:
    """``zoneout`` as ``(p_c, p_h)``: one probability for both, or a pair."""
    if isinstance(zoneout, (tuple, list)):
        if len(zoneout) != 2:
            raise ValueError(f"LSTM: zoneout must be a probability or a pair (p_c, p_h), got {zoneout!r}")
        return _probability("zoneout's p_c", zoneout[0]), _probability("zoneout's p_h", zoneout[1])
    p = _probability("zoneout", zoneout)
    return p, p


@dataclass(frozen=True)
class Regularisation:
    """What an LSTM does beyond ``nn.LSTM`` while training (checked on construction)."""

    weight_dropout: float = 0.0
    dropout_mode: str = "element"
    zoneout: Union[float, Tuple[float, float]] = (0.0, 0.0)

    def __post_init__(self) -> None:
        _probability("weight_dropout", self.weight_dropout)
        if self.dropout_mode not in DROPOUT_MODES:
            raise ValueError(f"LSTM: dropout_mode must be one of {', '.join(map(repr, DROPOUT_MODES))}, "
                             f"got {self.dropout_mode!r}")
        object.__setattr__(self, "zoneout", _zoneout_pair(self.zoneout))

    @property
    def is_plain(self) -> bool:
        """Whether it is ``nn.LSTM``'s own (nothing beyond)."""
        return self.weight_dropout == 0.0 and self.dropout_mode == "element" and not self.zoned

    @property
    def zoned(self) -> bool:
        """Whether the layers run under zoneout (in training and evaluation)."""
        return self.zoneout != (0.0, 0.0)

    def layer_by_layer(self, training: bool, dropout: float) -> bool:
        """Whether a call must run the layers one after another (the CUDA
        stack graph and wavefront draw no such masks)."""
        return self.zoned or training and (
            self.weight_dropout > 0.0 or (self.dropout_mode == "variational" and dropout > 0.0))

    def check_module(self, proj_size: int) -> None:
        """Raises where the LSTM's own arguments exclude an option."""
        if self.zoned and proj_size > 0:
            raise ValueError(f"LSTM: zoneout={self.zoneout} with proj_size={proj_size} is not supported (the state "
                             "zoned would be the projected h); use proj_size=0")

    def keep_weights(self, shape: Sequence[int], training: bool, like: Tensor) -> Tuple[Tensor, Tensor]:
        """Zoneout's keep weights ``(keep_c, keep_h)`` for a layer direction
        whose output (without projection) has ``shape``: masks while
        training (none drawn for a probability of 0), else the probabilities."""
        def keep(p: float) -> Tensor:
            if training and p > 0.0:
                return zoneout_mask(shape, p, like)
            return like.new_full((shape[-1],), p).expand(*shape)
        p_c, p_h = self.zoneout
        return keep(p_c), keep(p_h)

    def layer_weights(self, weights: List[Optional[Tensor]], training: bool,
                      seed: Optional[int] = None) -> List[Optional[Tensor]]:
        """``[w_ih, w_hh, b_ih, b_hh, w_hr]`` of one layer and direction for
        this call: ``w_hh`` dropped while training with ``weight_dropout``
        (its mask drawn from ``seed``, else torch's generator)."""
        if not training or self.weight_dropout == 0.0:
            return weights
        w_ih, w_hh, *rest = weights
        return [w_ih, w_hh * weight_mask(w_hh, self.weight_dropout, seed), *rest]

    def between_layers(self, x: Tensor, p: float, training: bool, batch_sizes: Optional[Tensor] = None) -> Tensor:
        """The dropout between two layers on ``x``, time-major ``[T, B, F]``
        or the rows of a ``PackedSequence`` (``batch_sizes`` given)."""
        if p == 0.0 or not training:
            return x
        if self.dropout_mode == "element":
            return F.dropout(x, p=p, training=True)
        if batch_sizes is None:
            return x * sequence_mask(x.size(1), x.size(2), p, x)
        mask = sequence_mask(int(batch_sizes[0]), x.size(1), p, x)
        # Row r of packed data is sequence r - (rows before its step) of its step.
        sequence = torch.cat([torch.arange(int(b)) for b in batch_sizes]).to(x.device)
        return x * mask[sequence]

    def extra_repr(self) -> str:
        parts = []
        if self.weight_dropout:
            parts.append(f"weight_dropout={self.weight_dropout}")
        if self.dropout_mode != "element":
            parts.append(f"dropout_mode={self.dropout_mode!r}")
        if self.zoned:
            parts.append(f"zoneout={self.zoneout}")
        return ", ".join(parts)
