"""PackedSequence input through a pipeline: what the front-ends share.

The engine takes a PackedSequence's data ``[N, ...]`` and its
``batch_sizes`` as they are: each work item is the packed rows of one
micro-batch (a run of the sequences sorted by decreasing length) over one
time chunk, so no stage computes on padding (``csrc/pipeline/items.h``).
Here: the checks of a packed run, the initial states put in the sorted
order the engine runs in, and the results put back in the caller's order
(``sorted_indices`` / ``unsorted_indices``, as ``torch.nn.LSTM`` does).
"""

from typing import List, Optional, Sequence, Union

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

__all__ = ["check_packed_input", "packed_target", "sort_states", "stage_input", "unsort_states"]


def check_packed_input(core, data: Tensor, batch_sizes: Tensor, on_device: bool = False) -> None:
    """Checks a PackedSequence's data against the core's first unit:
    ``[N]`` integer indices (first unit an Embedding) or ``[N, I]`` features,
    and its ``batch_sizes`` (1-D int64 on the CPU, positive, non-increasing).

    Raises:
        ValueError: the wrong number of dimensions, dtype or batch sizes.
        RuntimeError: the wrong feature size or device (``core.check_input``).
    """
    who = core.who
    if not isinstance(batch_sizes, Tensor) or batch_sizes.dim() != 1 or batch_sizes.dtype != torch.int64 \
            or batch_sizes.device.type != "cpu" or batch_sizes.numel() == 0:
        raise ValueError(f"{who}: expected the PackedSequence's batch_sizes as a non-empty 1-D int64 CPU tensor "
                         "(as torch.nn.utils.rnn.pack_padded_sequence makes it)")
    if bool((batch_sizes <= 0).any()) or bool((batch_sizes[1:] > batch_sizes[:-1]).any()):
        raise ValueError(f"{who}: expected the PackedSequence's batch_sizes positive and non-increasing, "
                         f"got {batch_sizes.tolist()}")
    indices = next((u.kind == "embedding" for u in core.units if not u.is_dropout and u.kind != "activation"), False)
    want = 1 if indices else 2
    if data.dim() != want or data.size(0) != int(batch_sizes.sum()):
        shape = "[N] indices" if indices else "[N, I] features"
        raise ValueError(f"{who}: expected the PackedSequence's data of shape {shape} with N = "
                         f"{int(batch_sizes.sum())} (the sum of batch_sizes), got {list(data.shape)}")
    core.check_input(data.unsqueeze(1), on_device=on_device)  # dtype, feature size, device as [N, 1, ...]


def packed_target(who: str, target: Union[None, Tensor, PackedSequence], seq: PackedSequence) -> Optional[Tensor]:
    """The loss's target for packed input, as its packed rows ``[N]``: a
    PackedSequence packed like the input, or its data.

    Raises:
        ValueError: a target packed otherwise, or not int64 of N rows.
    """
    if target is None:
        return None
    if isinstance(target, PackedSequence):
        same = torch.equal(target.batch_sizes, seq.batch_sizes) and (
            (target.sorted_indices is None) == (seq.sorted_indices is None)
            and (seq.sorted_indices is None or torch.equal(target.sorted_indices, seq.sorted_indices)))
        if not same:
            raise ValueError(f"{who}: the target PackedSequence is packed differently from the input (its "
                             "batch_sizes or sorted_indices differ); pack both from the same lengths")
        target = target.data
    n = seq.data.size(0)
    if not isinstance(target, Tensor) or target.dim() != 1 or target.size(0) != n or target.dtype != torch.int64:
        got = f"{target.dtype} {list(target.shape)}" if isinstance(target, Tensor) else type(target).__name__
        raise ValueError(f"{who}: with packed input, expected target as a PackedSequence packed like it or its "
                         f"data, int64 of shape [{n}], got {got}")
    return target


def sort_states(states: Sequence[Optional[Tensor]], sorted_indices: Optional[Tensor]) -> List[Optional[Tensor]]:
    """Per-layer initial states ``[B, ...]`` in the caller's order, put in
    the order of the sorted sequences the engine runs (None stays None);
    with ``unsorted_indices`` instead, per-layer final states back."""
    if sorted_indices is None:
        return list(states)
    return [None if s is None else s.index_select(0, sorted_indices.to(s.device)) for s in states]


def unsort_states(states: Tensor, unsorted_indices: Optional[Tensor]) -> Tensor:
    """Final states ``[L, B, ...]`` of the sorted sequences, in the caller's order."""
    if unsorted_indices is None:
        return states
    return states.index_select(1, unsorted_indices.to(states.device))


def stage_input(core, seq: PackedSequence, target, first: bool, loss_here: bool, device: torch.device,
                features: int, dtype: torch.dtype):
    """One rank's view of a packed run of ``PipelineParallel`` (every rank
    gets the same PackedSequence, or at least its ``batch_sizes`` and data
    shape): ``(x, target)``, ``x`` the data on the first stage's device on
    the first rank, elsewhere only its shape ``[N, features]`` (meta: the
    activations come from the previous rank); ``target`` the packed rows
    where this rank computes the loss, else None.

    Raises:
        ValueError, RuntimeError: as ``check_packed_input`` (the first rank:
            also the data) and ``packed_target`` (the loss's rank).
    """
    if first:
        check_packed_input(core, seq.data, seq.batch_sizes)
        x = seq.data.to(device)
    else:
        if seq.batch_sizes.dim() != 1 or int(seq.batch_sizes.sum()) != seq.data.size(0):
            raise ValueError(f"{core.who}: the PackedSequence's data has {seq.data.size(0)} rows, but its "
                             f"batch_sizes sum to {int(seq.batch_sizes.sum())}")
        x = torch.empty(seq.data.size(0), features, dtype=dtype, device="meta")
    if not loss_here:
        return x, None
    target = packed_target(core.who, target, seq)
    if target is None:
        core.check_target(None, 0, 0)  # raises: the loss needs its target
    return x, target
