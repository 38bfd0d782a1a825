"""An LSTM as users write one where no fused layer does what they need: per
layer a cell stepped over time in Python. The benches' baseline for the
options that ``nn.LSTM`` lacks (``bench layernorm``, ``bench regularisation``)."""

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CellLoop"]


class CellLoop(nn.Module):
    """``self.cells`` (an ``nn.ModuleList``, one cell per layer, each with
    ``hidden_size``) stepped over ``x`` [T, B, I] from zero states, with
    dropout ``self.dropout`` between layers in training; returns the last
    layer's output and ``None``, as far as a benchmark needs ``nn.LSTM``'s."""

    dropout = 0.0

    def step(self, cell: nn.Module, x: torch.Tensor, state):
        """One step of ``cell``: its new ``(h, c)``."""
        return cell(x, state)

    def forward(self, x):
        for layer, cell in enumerate(self.cells):
            h = c = x.new_zeros(x.size(1), cell.hidden_size)
            out = []
            for t in range(x.size(0)):
                h, c = self.step(cell, x[t], (h, c))
                out.append(h)
            x = torch.stack(out)
            if self.dropout > 0 and layer < len(self.cells) - 1:
                x = F.dropout(x, self.dropout, self.training)
        return x, None
