"""The input checks ``pipelstm.LSTM`` and ``pipelstm.LSTMCell`` share, made to
refuse what ``torch.nn.LSTM`` and ``torch.nn.LSTMCell`` refuse with the
exception types they raise on purpose (README, "What differs")."""

import torch
from torch import Tensor

__all__ = ["check_state_pair", "packed_batch"]


def check_state_pair(who: str, hx, names: str) -> None:
    """hx is a pair of tensors, refused as nn.LSTM and nn.LSTMCell refuse it
    on purpose: a pair of another length is their RuntimeError ("expects two
    hidden states"), anything else a TypeError (their bindings' refusal of a
    non-tuple; nn.LSTM's Python code fails first on some of these, with an
    IndexError or AttributeError from indexing the malformed value)."""
    if not isinstance(hx, (tuple, list)):
        raise TypeError(f"{who}: expected hx to be a tuple {names} of two tensors, got {type(hx).__name__}")
    if len(hx) != 2:
        raise RuntimeError(f"{who}: expected hx to be a tuple {names} of two tensors (two hidden states), "
                           f"got a {type(hx).__name__} of length {len(hx)}")
    for i, t in enumerate(hx):
        if not isinstance(t, Tensor):
            raise TypeError(f"{who}: expected hx[{i}] to be a tensor, got {type(t).__name__}")


def packed_batch(batch_sizes: Tensor) -> int:
    """The batch of a PackedSequence: its first batch size.

    Raises:
        RuntimeError: ``batch_sizes`` is not a 1-D int64 tensor (nn.LSTM's
            kernel refuses it so; its Python code, without hx, first fails
            with a TypeError making the zero state).
        IndexError: ``batch_sizes`` is empty (as nn.LSTM).
    """
    if batch_sizes.dim() != 1 or batch_sizes.dtype != torch.int64:
        raise RuntimeError(f"LSTM: expected the PackedSequence's batch_sizes to be a 1-D int64 tensor, got "
                           f"{batch_sizes.dim()}-D {batch_sizes.dtype}")
    if batch_sizes.numel() == 0:
        raise IndexError("LSTM: the PackedSequence's batch_sizes is empty (a packed batch has at least one step)")
    return int(batch_sizes[0])
