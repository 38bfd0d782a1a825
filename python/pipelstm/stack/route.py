"""How a call of ``pipelstm.LSTM`` runs its stack of layers: the one place
that decides it, from the call's facts and the switches of
``pipelstm.backends.cuda``.

* ``"layers"``: the layers one after another, each one op call (the ops
  pick their own fused kernel or, under torch.func transforms, their
  composition);
* ``"wavefront"``: the layers on CUDA streams of their own over ``chunks``
  time chunks (``wavefront.py``);
* ``"stack_graph"``: the whole stack captured as one CUDA graph each way
  and replayed (``graph.py``), the layers inside it one after
  another (``chunks`` 0) or as a wavefront of ``chunks`` time chunks.

Only a dense CUDA input outside tracing, scripting, compiling and torch.func
transforms takes a CUDA strategy; the stack graph only a training call (grad
enabled) outside autocast, and a wavefront only a unidirectional stack of
two or more layers, over at most T chunks.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ..backends import cuda as cuda_switches
from ..op_autograd import under_functorch_transform

__all__ = ["StackRoute", "stack_route"]


@dataclass(frozen=True)
class StackRoute:
    kind: str  # "layers", "wavefront" or "stack_graph"
    chunks: int = 0  # time chunks of a wavefront (0: none)
    kernels: tuple = ()  # the stack graph's: the kernel switches its capture records


LAYERS = StackRoute("layers")


def stack_route(x: Tensor, num_layers: int, bidirectional: bool, packed: bool,
                layer_by_layer: bool = False) -> StackRoute:
    """The route of one call over time-major ``x``.

    Args:
        x: the stack's input (its device, length and dtype decide).
        num_layers, bidirectional: the stack's.
        packed: the input is a ``PackedSequence``'s rows.
        layer_by_layer: the call must run its layers one after another
            (its regularisation draws masks the CUDA strategies do not).
    """
    if packed or layer_by_layer or not _is_cuda(x) or under_functorch_transform():
        return LAYERS
    if torch.jit.is_tracing() or torch.jit.is_scripting() or torch.compiler.is_compiling():
        return LAYERS
    wavefront_ok = num_layers >= 2 and not bidirectional
    graph = cuda_switches.stack_graph
    if graph and torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type):
        return StackRoute("stack_graph", _chunks(graph, x) if wavefront_ok else 0,
                          (cuda_switches.persistent, cuda_switches.persistent_kernel))
    wave = cuda_switches.layer_wavefront
    if wave and wavefront_ok and _chunks(wave, x):
        return StackRoute("wavefront", _chunks(wave, x))
    return LAYERS


def _is_cuda(x: Tensor) -> bool:
    return x.device.type == "cuda"


def _chunks(k: int, x: Tensor) -> int:
    """K time chunks over ``x``, at most its length; 0 where that leaves one."""
    k = min(k, x.size(0))
    return k if k > 1 else 0
