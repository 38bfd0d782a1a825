"""The geometry of one LSTM layer: its sizes and the layout of its workspace.

One source for what the fake kernels (hooks/fake_kernels.py), the pipeline's cost
model (pipeline/units.py) and the modules read off a layer's weights: the
hidden size H from ``w_ih`` (``[4H, I]``), the projection size P from
``w_hr`` (``[P, H]``, absent without projection), the width of the output
and of the hidden state (P with a projection, else H), and the workspace
the fused forward fills for the backward (csrc/layer_geometry.h): per row, the
activated gates (4H) and the cell state (H) and, with a projection, the
unprojected hidden state (H).
"""

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

__all__ = ["LayerGeometry"]


@dataclass(frozen=True)
class LayerGeometry:
    """The sizes of one LSTM layer (ints, or SymInts under tracing).

    Args:
        input_size: I, the width of the layer's input.
        hidden_size: H, the width of the cell state.
        proj_size: P, the width of the projected hidden state; 0 for none.
    """

    input_size: int
    hidden_size: int
    proj_size: int = 0

    @classmethod
    def of(cls, w_ih: Tensor, w_hr: Optional[Tensor] = None) -> "LayerGeometry":
        """The geometry of the layer with input weights ``w_ih`` ``[4H, I]``
        and, if projected, projection ``w_hr`` ``[P, H]``. The shapes are
        read, not checked: the callers check them (with their own messages)."""
        return cls(w_ih.shape[1], w_ih.shape[0] // 4, 0 if w_hr is None else w_hr.shape[0])

    @property
    def projected(self) -> bool:
        """Whether the layer has a projection (``w_hr``)."""
        # A SymInt (under tracing) comes only from a w_hr: projected, with no guard on its value.
        return not isinstance(self.proj_size, int) or self.proj_size > 0

    @property
    def out_size(self) -> int:
        """The width of the output and of ``h``: P with a projection, else H."""
        return self.proj_size if self.projected else self.hidden_size

    @property
    def workspace_width(self) -> int:
        """Workspace elements per row (time step x sequence): the activated
        gates (4H), the cell state (H) and, with a projection, the
        unprojected hidden state (H)."""
        return (6 if self.projected else 5) * self.hidden_size

    def workspace_numel(self, rows) -> int:
        """The workspace's length for ``rows`` rows (``T * B``, or a packed batch's rows)."""
        return rows * self.workspace_width

