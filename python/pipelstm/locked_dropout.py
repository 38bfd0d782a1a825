"""``pipelstm.LockedDropout``: variational (locked) dropout, one mask per sequence.

AWD-LSTM drops the embeddings, the outputs between layers and the final
output with one mask per sequence, the same at every step (Gal &
Ghahramani 2016), where ``nn.Dropout`` draws one per element. In a
:class:`pipelstm.Pipeline` it is a unit of its own, whose mask a sequence
keeps across time chunks; ``pipelstm.LSTM(dropout_mode="variational")``
uses the same unit between its layers.
"""

from typing import Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from .regularisation import sequence_mask

__all__ = ["LockedDropout"]


class LockedDropout(nn.Module):
    """Dropout with one mask per sequence, the same at every step.

    Args:
        p: the probability of zeroing a feature of a sequence, in [0, 1).
        batch_first: the input is ``[B, T, F]`` rather than ``[T, B, F]``
            (a ``Pipeline`` takes it time-major only).

    Input: ``[T, B, F]`` (``[B, T, F]`` with ``batch_first``) or a
    ``PackedSequence``; the output has its shape. While training each
    sequence's features are zeroed with probability ``p`` and the others
    scaled by ``1 / (1 - p)``, one draw per sequence; in evaluation it is
    the identity.
    """

    _pipeline_unit_kind = "variational_dropout"  # a pipeline's unit for it (pipeline/units.py)

    def __init__(self, p: float = 0.5, batch_first: bool = False) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"LockedDropout: p must be a probability in [0, 1), got {p!r}")
        self.p, self.batch_first = float(p), batch_first

    def forward(self, x: Union[Tensor, PackedSequence]) -> Union[Tensor, PackedSequence]:
        if not self.training or self.p == 0.0:
            return x
        if isinstance(x, PackedSequence):
            rows = sequence_mask(int(x.batch_sizes[0]), x.data.size(-1), self.p, x.data)
            # Row r of the data is sequence r - (rows before its step) of its step.
            sequence = torch.cat([torch.arange(int(b)) for b in x.batch_sizes]).to(x.data.device)
            return x._replace(data=x.data * rows[sequence])
        if x.dim() != 3:
            raise ValueError(f"LockedDropout: expected a 3-D input ({'[B, T, F]' if self.batch_first else '[T, B, F]'})"
                             f" or a PackedSequence, got shape {list(x.shape)}")
        batch = 0 if self.batch_first else 1
        mask = sequence_mask(x.size(batch), x.size(-1), self.p, x)
        return x * mask.unsqueeze(1 if self.batch_first else 0)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", batch_first=True" if self.batch_first else "")
