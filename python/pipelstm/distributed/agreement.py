"""Every rank of a ``PipelineParallel`` job must build the same model with
the same pipeline settings; this checks that they did, before any step."""

from typing import List

import torch.distributed as dist
from torch import nn

from .mesh import Mesh

__all__ = ["check_same_everywhere"]


def check_same_everywhere(model: nn.Sequential, units, balance, chunks: int, micro_batches: int,
                           local_stages: int, mesh: Mesh) -> int:
    """All-gathers each rank's model definition and plan; raises on every
    rank when they differ. Returns the global index of this rank's first
    stage (stages of earlier pipeline ranks counted)."""
    mine = dict(
        model=[(name, tuple(p.shape), str(p.dtype)) for name, p in model.named_parameters()],
        units=[(u.kind, u.name) for u in units],
        plan=dict(pp=mesh.pp, dp=mesh.dp, balance=list(balance), chunks=chunks, micro_batches=micro_batches),
        local_stages=local_stages,
    )
    everyone: List[dict] = [None] * mesh.world_size  # type: ignore[list-item]
    with mesh.waiting_for("every rank's model and plan from", mesh.others(range(mesh.world_size))):
        dist.all_gather_object(everyone, mine)
    ref = everyone[0]
    for r, other in enumerate(everyone):
        for what in ("model", "units", "plan"):
            if other[what] != ref[what]:
                diff = _first_difference(ref[what], other[what])
                raise ValueError(f"pipelstm.distributed: rank {r}'s {what} differs from rank 0's ({diff}); every "
                                 "rank must build the same model with the same pipeline settings")
    return sum(everyone[r]["local_stages"] for r in mesh.pp_ranks[: mesh.pp_rank])


def _first_difference(a, b) -> str:
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"rank 0 has {x}, it has {y}"
        return f"rank 0 has {len(a)} entries, it has {len(b)}"
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a:
            if a.get(k) != b.get(k):
                return f"{k}: rank 0 has {a.get(k)}, it has {b.get(k)}"
    return f"rank 0 has {a}, it has {b}"
