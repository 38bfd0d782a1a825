"""The whole pipelined forward as one autograd node (``PipelineCore.run``).

Its forward is the engine's forward; its backward the engine's pipelined
backward, which returns the gradients of the input, the initial states and
every parameter, each on its own stage's device.
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor

from .. import _C

__all__: List[str] = []

_engine = _C.pipeline


class _PipelineFunction(torch.autograd.Function):
    """The whole pipelined forward as one autograd node; its backward is the
    engine's pipelined backward, returning the gradients of the input, the
    initial states and every parameter (each on its own stage's device)."""

    @staticmethod
    def forward(ctx, core, layout, training: bool, target: Optional[Tensor], input: Tensor,
                *tensors: Optional[Tensor]):
        L, unit_counts, batch_sizes, pass_seed = layout
        h0, c0 = list(tensors[:L]), list(tensors[L : 2 * L])
        params = _unflatten(tensors[2 * L :], unit_counts)
        run = core.engine.forward(
            input, h0, c0, params, core.chunks, core.micro_batches, training, True,
            getattr(_engine.Checkpoint, core.checkpoint), target, batch_sizes, pass_seed,
        )
        core.saved_activation_bytes = run.saved_bytes
        ctx.run, ctx.layout = run, layout
        ctx.input_device, ctx.input_float = input.device, input.is_floating_point()
        ctx.state_devices = [None if t is None else t.device for t in tensors[: 2 * L]]
        ctx.set_materialize_grads(False)
        # Taken, not read: a run that kept its outputs would be reachable
        # from them through this node, a cycle never freed (one per step).
        output, h_n, c_n = run.take_outputs()
        return (output, *h_n, *c_n)

    @staticmethod
    def backward(ctx, grad_output, *grad_states):
        L, unit_counts = ctx.layout[:2]
        run = ctx.run  # frees its saved activations as it goes; a second backward raises
        grad_input, gh0, gc0, gparams = run.backward(
            grad_output, list(grad_states[:L]), list(grad_states[L:])
        )
        if grad_input is not None:
            grad_input = grad_input.to(ctx.input_device) if ctx.input_float else None
        states = [
            None if g is None or d is None else g.to(d) for g, d in zip(list(gh0) + list(gc0), ctx.state_devices)
        ]
        # gparams has an entry per parameter slot; keep those the forward got.
        flat = []
        for unit_grads, count in zip(gparams, unit_counts):
            flat.extend(g for g, present in zip(unit_grads, count) if present)
        return (None, None, None, None, grad_input, *states, *flat)


def _unflatten(flat: Sequence[Tensor], unit_counts) -> List[List[Optional[Tensor]]]:
    """Per unit, its parameter slots (None where absent) from the flat list."""
    out, i = [], 0
    for present in unit_counts:
        params = []
        for p in present:
            params.append(flat[i] if p else None)
            i += p
        out.append(params)
    return out
