"""What the fused ops' Python wrappers share (ops.py, layernorm_ops.py):
when a call runs on the op's ATen composition instead of its fused kernels,
and a reduced-precision call computed in float32. The ops' autograd
formulas are C++ (csrc/lstm_autograd.cpp, csrc/layernorm_autograd.cpp)."""

from typing import Optional

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

__all__ = ["under_functorch_transform", "composed", "unwrapped", "REDUCED", "rounded_from_float32"]

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


def rounded_from_float32(layer, dtype: torch.dtype, *args):
    """``layer(*args)`` on float32 copies of its floating-point tensors, its
    results rounded to ``dtype`` once (and, through the casts, its gradients):
    a reduced-precision call of a fused op that computes in float32, as the
    plain layer's are on the CPU (csrc/float32_upcast.h)."""
    args = [a.float() if isinstance(a, Tensor) and a.is_floating_point() else a for a in args]
    return tuple(t.to(dtype) for t in layer(*args))
