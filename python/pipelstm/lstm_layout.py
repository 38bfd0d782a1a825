"""The layouts of ``pipelstm.LSTM``'s inputs and outputs: ``batch_first``,
unbatched input, and the initial state (given or zeros), as
``torch.nn.LSTM`` takes and returns them. The stack runs time-major and
batched; these bring a call's tensors to that form and back."""

from typing import Tuple

import torch
from torch import Tensor, nn

from .input_checks import check_state_pair

__all__ = ["batched", "initial_state", "as_given"]

_State = Tuple[Tensor, Tensor]


def batched(lstm: nn.RNNBase, data: Tensor) -> Tuple[Tensor, bool, int]:
    """(the input with a batch dimension, whether it had one, the batch dimension)."""
    if data.dim() not in (2, 3):
        raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {data.dim()}D instead")
    is_batched = data.dim() == 3
    batch_dim = 0 if lstm.batch_first else 1
    return (data if is_batched else data.unsqueeze(batch_dim)), is_batched, batch_dim


def initial_state(lstm: nn.RNNBase, data: Tensor, batch: int, hx, is_batched: bool) -> _State:
    """``(h_0, c_0)`` as ``[layers * directions, B, *]``: zeros where ``hx``
    is None, else ``hx`` checked (a pair of tensors of the input's rank)."""
    directions = 2 if lstm.bidirectional else 1
    if hx is None:
        out_size = lstm.proj_size if lstm.proj_size > 0 else lstm.hidden_size
        zeros = dict(dtype=data.dtype, device=data.device)
        return (
            torch.zeros(lstm.num_layers * directions, batch, out_size, **zeros),
            torch.zeros(lstm.num_layers * directions, batch, lstm.hidden_size, **zeros),
        )
    check_state_pair("LSTM", hx, "(h_0, c_0)")
    want = 3 if is_batched else 2
    if hx[0].dim() != want or hx[1].dim() != want:
        kind = "batched 3-D" if is_batched else "unbatched 2-D"
        raise RuntimeError(
            f"For {kind} input, hx and cx should also be {want}-D but got "
            f"({hx[0].dim()}-D, {hx[1].dim()}-D) tensors"
        )
    return (hx[0], hx[1]) if is_batched else (hx[0].unsqueeze(1), hx[1].unsqueeze(1))


def as_given(lstm: nn.RNNBase, output: Tensor, h_n: Tensor, c_n: Tensor, is_batched: bool,
             batch_dim: int) -> Tuple[Tensor, _State]:
    """Time-major results back in the layout of the input (batch_first, unbatched)."""
    if lstm.batch_first:
        output = output.transpose(0, 1)
    if not is_batched:
        output = output.squeeze(batch_dim)
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return output, (h_n, c_n)
