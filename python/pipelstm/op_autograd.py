"""What the fused ops' Python wrappers share (ops.py, layernorm_ops.py):
when a call runs on the op's ATen composition instead of its fused kernels,
and a reduced-precision call computed in float32; and for the one formula
registered from Python (the LayerNorm op's, whose composition is Python):
the create_graph=True backward through that composition and the marks that
keep autograd from zero-filling unused outputs or from differentiating a
backward op. The other ops' formulas do the same in C++
(csrc/lstm_autograd.cpp)."""

from typing import Optional

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

__all__ = ["under_functorch_transform", "composed", "unwrapped", "gradient_is_differentiated", "composed_backward",
           "no_zero_fill_for_unused_outputs", "no_double_backward", "REDUCED", "rounded_from_float32"]

REDUCED = (torch.bfloat16, torch.float16)


def under_functorch_transform() -> bool:
    """Whether a torch.func transform is active. Under torch.compile this is
    evaluated once while the frame is traced: TorchDynamo models
    ``peek_interpreter_stack()`` as an object even where it is None, which
    would send every compiled call to the composition."""
    return torch._C._functorch.peek_interpreter_stack() is not None


# What torch.compiler.assume_constant_result(fn) does, set here without it:
# calling it imports TorchDynamo, which would make `import pipelstm` take
# seconds. tests/test_module_compile.py fails if the mark stops working.
under_functorch_transform._dynamo_marked_constant = True  # type: ignore[attr-defined]


def composed(*tensors: Optional[Tensor]) -> bool:
    """Whether this call must run on the ATen composition of the op
    (csrc/lstm_composite.cpp) rather than the fused kernels.

    The fused ops have reverse-mode formulas only. Under a torch.func
    transform (grad, vjp, jacrev, vmap, jvp, jacfwd) or with forward-mode
    dual tensors, the composition gives the exact result (autograd, forward
    AD and vmap know all of its ops), where the fused op would raise or, worse,
    be treated as a constant (a zero tangent)."""
    if under_functorch_transform():
        return True
    return fwAD._current_level >= 0 and any(
        t is not None and fwAD.unpack_dual(t).tangent is not None for t in tensors
    )


def unwrapped(batch_sizes: Tensor) -> Tensor:
    """``batch_sizes`` as the plain CPU tensor it is outside torch.func
    transforms (under ``grad`` it arrives wrapped, like every tensor made
    inside the transformed function)."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(batch_sizes):
        if functorch.is_batchedtensor(batch_sizes):
            raise ValueError("pipelstm: a PackedSequence's batch_sizes cannot be vmapped over: every sample of a "
                             "vmapped batch must share one batch_sizes")
        batch_sizes = functorch.get_unwrapped(batch_sizes)
    return batch_sizes


def gradient_is_differentiated() -> bool:
    # Autograd runs a backward with grad mode on only for create_graph=True:
    # the gradient is then an input to a further derivative.
    return torch.is_grad_enabled()


def composed_backward(ctx, composite, inputs, grad_outputs, skip: Optional[int] = None):
    """The backward for create_graph=True: the gradient recomputed through
    the op's ATen composition, so that it is itself differentiable (double
    backward, gradient penalties, gradgradcheck). ``skip`` is the position of
    a non-tensor op argument (``batch_sizes``) the composition does not take.
    Returns one gradient per op argument, ``None`` for those not needed."""
    needs = list(ctx.needs_input_grad)
    if skip is not None:
        del needs[skip]
    needs = needs[: len(inputs)]
    wanted = [i for i, (t, need) in enumerate(zip(inputs, needs)) if need and t is not None]
    with torch.enable_grad():
        outputs = composite(*inputs)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
    grads = [None] * len(inputs)
    if wanted and pairs:
        got = torch.autograd.grad(
            [o for o, _ in pairs], [inputs[i] for i in wanted], [g for _, g in pairs],
            create_graph=True, allow_unused=True,
        )
        for i, g in zip(wanted, got):
            grads[i] = g if g is not None else torch.zeros_like(inputs[i])
    if skip is not None:
        grads.insert(skip, None)
    return tuple(grads) + (None,) * (len(ctx.needs_input_grad) - len(grads))


def no_zero_fill_for_unused_outputs(ctx, workspace: Tensor) -> None:
    # Without this autograd would allocate and zero a gradient for the
    # (large) workspace and for every unused output; the backward ops take
    # None for "no gradient" instead.
    ctx.mark_non_differentiable(workspace)
    ctx.set_materialize_grads(False)


# --- double backward -----------------------------------------------------------
# With create_graph=True the forward ops' backward differentiates their
# composition (composed_backward), so the backward ops below never end up
# in a graph that is differentiated again. Called directly, they have no
# derivative: a clear error rather than silent zeros.
def no_double_backward(ctx, *grads):
    raise RuntimeError(
        "pipelstm: double backward (a gradient of a gradient, e.g. create_graph=True followed by a second "
        "backward) through pipelstm's LSTM ops is not supported"
    )


def rounded_from_float32(layer, dtype: torch.dtype, *args):
    """``layer(*args)`` on float32 copies of its floating-point tensors, its
    results rounded to ``dtype`` once (and, through the casts, its gradients):
    a reduced-precision call of a fused op that computes in float32, as the
    plain layer's are on the CPU (csrc/float32_upcast.h)."""
    args = [a.float() if isinstance(a, Tensor) and a.is_floating_point() else a for a in args]
    return tuple(t.to(dtype) for t in layer(*args))
