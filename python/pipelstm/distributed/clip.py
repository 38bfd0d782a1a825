"""Gradient clipping over the whole pipelined model."""

import math
from typing import Iterable, Union

import torch
import torch.distributed as dist
from torch import Tensor

from .mesh import Mesh

__all__ = ["clip_grad_norm_"]


def clip_grad_norm_(parameters: Union[Tensor, Iterable[Tensor]], max_norm: float, mesh: Mesh,
                    norm_type: float = 2.0) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a model split over the stages
    of ``mesh``: the norm is that of all stages' gradients together (the
    unsplit model's), not of this stage's. Call it on every rank with this
    stage's parameters, after backward. The replicas of a stage hold the same
    (averaged) gradients, so the norm is reduced over the pipeline group.
    Returns the total norm (float32 or the gradients' dtype), as torch does.
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if norm_type not in (2.0, math.inf):
        raise ValueError(f"clip_grad_norm_: norm_type must be 2 or inf, got {norm_type}")
    dtype = grads[0].dtype if grads else torch.float32
    if norm_type == math.inf:
        local = max((g.detach().abs().max().double() for g in grads), default=torch.zeros((), dtype=torch.float64))
        total = local.to(mesh.device).reshape(())
        if mesh.pp > 1:
            with mesh.waiting_for("the gradient norm all-reduce with", mesh.others(mesh.pp_ranks), holding=[total]):
                dist.all_reduce(total, op=dist.ReduceOp.MAX, group=mesh.pp_group)
    else:
        local = sum((g.detach().double().pow(2).sum() for g in grads), torch.zeros((), dtype=torch.float64))
        total = local.to(mesh.device).reshape(())
        if mesh.pp > 1:
            with mesh.waiting_for("the gradient norm all-reduce with", mesh.others(mesh.pp_ranks), holding=[total]):
                dist.all_reduce(total, group=mesh.pp_group)
        total = total.sqrt()
    total = total.to(dtype)
    clip_coef = float(max_norm) / (float(total) + 1e-6)
    if clip_coef < 1.0:
        for g in grads:
            g.detach().mul_(clip_coef)
    return total.cpu()
