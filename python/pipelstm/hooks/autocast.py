"""What the fused LSTM ops do under ``torch.autocast``.

- CUDA: the floating inputs on the GPU (float32, not float64) are cast to
  the dtype autocast asks for, ``torch.get_autocast_dtype("cuda")``, float16
  or bfloat16, and the op runs in it, as ``nn.LSTMCell`` does (``lstm_cell``
  is on autocast's lower-precision list). ``nn.LSTM``'s cuDNN path always
  casts to float16, whatever dtype autocast asks for (ATen's
  ``cudnn/AutocastRNN.cpp``); pipelstm follows the asked dtype, so a
  bfloat16 run keeps bfloat16's range.
- CPU: the CPU kernels compute in float32 or float64, so the ops take their
  floating inputs in float32 (more accurate than the bfloat16 ``nn.LSTM``
  would use where oneDNN has it, and never a dtype mismatch).

Only the forward ops have a rule: the backward ops run in autograd's
backward pass, outside autocast.
"""

from typing import Callable

import torch
from torch.amp.autocast_mode import _cast

__all__ = ["FORWARD_OPS", "cast_and_call", "register"]

FORWARD_OPS = ("lstm_cell_forward", "lstm_layer_forward", "lstm_packed_layer_forward")


def cast_and_call(op: Callable, device_type: str, dtype: torch.dtype, args: tuple):
    """``op(*args)`` with ``args``' eligible tensors cast to ``dtype`` and
    autocast off for ``device_type`` inside (the op's own ATen calls then
    run in the dtype the op was given). Eligible: floating, on
    ``device_type``, not float64 (autocast's own rule)."""
    key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
        return op(*_cast(args, device_type, dtype))


def _register(name: str, device_type: str, dtype: Callable[[], torch.dtype]) -> None:
    # Not torch.library.register_autocast: it takes one fixed dtype (the CUDA
    # rule reads the one autocast was entered with at each call), and up to
    # torch 2.11 its CPU rule also took the Python dispatcher's AutocastCUDA
    # entry, which then refused ours.
    op = getattr(torch.ops.pipelstm, name).default
    key = "Autocast" + torch._C._dispatch_key_for_device(device_type)

    def rule(*args):
        return cast_and_call(op, device_type, dtype(), args)

    # The Python-dispatcher entry (torch.compile traces through it) and the
    # C++ dispatcher's.
    op.py_kernels.pop(getattr(torch._C.DispatchKey, key), None)
    op.py_impl(getattr(torch._C.DispatchKey, key))(rule)
    _LIB.impl(name, lambda _keyset, *args: rule(*args), key, with_keyset=True)


_LIB = None  # the library the rules are registered through, once registered


def register() -> None:
    """Registers the forward ops' autocast rules for the CPU and CUDA
    (pipelstm's import does, once)."""
    global _LIB
    _LIB = torch.library.Library("pipelstm", "IMPL")
    for name in FORWARD_OPS:
        _register(name, "cpu", lambda: torch.float32)
        _register(name, "cuda", lambda: torch.get_autocast_dtype("cuda"))
