"""The engine's schedule, read from the engine itself.

Thin wrappers over ``pipelstm._C.pipeline``'s bindings of
``csrc/pipeline/schedule.h`` (the order every stage runs its items in, which
items are recomputed) and ``items.h`` (how a pass cuts ``[T, B]`` into
items), so the simulator plays exactly the order the engine runs.
"""

from typing import List, Tuple

from .. import _C

__all__ = ["CHECKPOINTS", "item_order", "recomputes", "ends_recurrence", "item_grid", "join_runs"]

_engine = _C.pipeline

# The recomputation modes, as pipelstm.Pipeline names them.
CHECKPOINTS = ("never", "except_last", "always")


def item_order(direction: str, K: int, M: int) -> List[Tuple[int, int]]:
    """The items ``(m, k)`` of a ``"forward"`` or ``"backward"`` pass in the
    order every stage runs them (``schedule.h``: ``item_order``)."""
    return [tuple(it) for it in _engine.item_order(direction, K, M)]


def recomputes(checkpoint: str, m: int, k: int, K: int, M: int) -> bool:
    """Whether item ``(m, k)``'s forward is replayed before its backward
    under ``checkpoint`` (``schedule.h``: ``recomputes``)."""
    return bool(_engine.recomputes(getattr(_engine.Checkpoint, checkpoint), m, k, K, M))


def ends_recurrence(direction: str, m: int, k: int, K: int) -> bool:
    """Whether micro-batch ``m``'s recurrence ends at item ``(m, k)`` in the
    pass (``schedule.h``: ``ends_recurrence``)."""
    return bool(_engine.ends_recurrence(direction, m, k, K))


def item_grid(T: int, B: int, chunks: int, micro_batches: int) -> Tuple[int, int, List[int], List[int]]:
    """``(K, M, t_sizes, b_sizes)``: the items a pass of ``[T, B]`` is cut
    into (``items.h``: K = min(chunks, T), M = min(micro_batches, B), the
    first pieces one longer, as ``torch.tensor_split``)."""
    K, M, t_sizes, b_sizes = _engine.item_grid(T, B, chunks, micro_batches)
    return int(K), int(M), list(t_sizes), list(b_sizes)


def join_runs(rows: List[int]) -> List[Tuple[int, int]]:
    """The runs ``[begin, end)`` of one micro-batch's chunks that an LSTM
    unit's weight task joins into one copy before its GEMMs, from each
    chunk's rows (``items.h``: ``join_runs``)."""
    return [tuple(r) for r in _engine.join_runs(list(rows))]
