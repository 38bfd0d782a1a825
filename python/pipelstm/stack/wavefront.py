"""The layers of a stacked LSTM on one CUDA device, run as a wavefront.

Run one after another, a stack of L layers costs L times one layer, though
layer l+1's step t needs only layer l's step t. Here each layer runs on a
CUDA stream of its own and the sequence is cut into K time chunks (as
``torch.tensor_split`` cuts it); layer l+1's chunk k waits only for layer
l's chunk k (an event), so it runs beside layer l's chunk k+1. The GPU is
busy with up to L chunks at once, at the cost of a bubble of
(L-1)/(K+L-1) and K*L layer calls instead of L.

The backward is the reverse wavefront by itself: autograd runs each op's
backward on the stream its forward ran on, and orders the streams as the
gradients flow (torch's stream semantics of backward passes).

``pipelstm.backends.cuda.layer_wavefront`` (``PIPELSTM_LAYER_WAVEFRONT``)
sets K; 0, the default, keeps the layers one after another. Dense,
unidirectional stacks of two or more layers only; under torch.func
transforms, tracing and export the layers run one after another.
"""

from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _C


__all__ = ["run_wavefront"]

_streams: Dict[Tuple[int, int], "torch.cuda.Stream"] = {}

LayerFn = Callable[[Tensor, Tensor, Tensor, int], Tuple[Tensor, Tensor, Tensor]]


def _layer_streams(device: torch.device, count: int) -> List["torch.cuda.Stream"]:
    """One stream per layer on ``device``, the same ones every call."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return [_streams.setdefault((index, l), torch.cuda.Stream(device=index)) for l in range(count)]


def run_wavefront(x: Tensor, h0: Sequence[Tensor], c0: Sequence[Tensor], layer: LayerFn, chunks: int,
                  dropout: float = 0.0, training: bool = False,
                  streams: Optional[Sequence["torch.cuda.Stream"]] = None) -> Tuple[Tensor, List[Tensor], List[Tensor]]:
    """Runs ``len(h0)`` layers over time-major ``x`` ``[T, B, I]`` as a
    wavefront of ``chunks`` time chunks.

    Args:
        x: the input of the first layer.
        h0, c0: per layer, its initial state ``[B, P]``, ``[B, H]``.
        layer: ``layer(x, h, c, l)`` runs layer ``l`` over ``x`` from state
            ``(h, c)`` and returns ``(output, h, c)``.
        chunks: K, at least 1 and at most ``T``.
        dropout: the dropout between two layers (training only).
        streams: one per layer (default: this device's layer streams on
            CUDA; none on the CPU, where the chunks run in order).

    Returns:
        The last layer's output ``[T, B, P]`` and each layer's final state,
        ready on the caller's current stream.
    """
    L, T = len(h0), x.size(0)
    if not 1 <= chunks <= T:
        raise ValueError(f"run_wavefront: chunks must be between 1 and the sequence length {T}, got {chunks}")
    cuda = x.device.type == "cuda"
    if streams is None and cuda:
        streams = _layer_streams(x.device, L)
    caller = torch.cuda.current_stream(x.device) if cuda else None
    if cuda:
        for s in streams:
            s.wait_stream(caller)  # the input, the states and the weights are the caller's
    pieces = list(x.tensor_split(chunks, dim=0))
    h, c = list(h0), list(c0)
    ready: List[List[Optional[torch.cuda.Event]]] = [[None] * chunks for _ in range(L)]
    # The layer calls' results that a graph lent, held to the end (after the
    # caller's stream has waited for the layers'): a graph replays over its
    # outputs once nothing holds them (csrc/graph_replay.h), and the next
    # layer's stream may still be reading them.
    held: List[Tensor] = []
    # Issued chunk by chunk, each chunk's layers in order: every stream's
    # queue gets its chunks in time order, and no layer waits on a chunk
    # issued after it.
    for k in range(chunks):
        for l in range(L):
            with torch.cuda.stream(streams[l]) if cuda else nullcontext():
                inp = pieces[k]
                if cuda:
                    if l > 0:
                        streams[l].wait_event(ready[l - 1][k])
                    inp.record_stream(streams[l])  # made on another stream, read on this one
                    if k == 0:
                        h[l].record_stream(streams[l])
                        c[l].record_stream(streams[l])
                if l > 0 and dropout > 0 and training:
                    inp = F.dropout(inp, p=dropout, training=True)
                pieces[k], h[l], c[l] = layer(inp, h[l], c[l], l)
                held += [t for t in (pieces[k], h[l], c[l]) if cuda and _C._is_lent(t)]
                if cuda:
                    ready[l][k] = torch.cuda.Event()
                    ready[l][k].record(streams[l])
    if cuda:
        for s in streams:
            caller.wait_stream(s)
        for t in pieces + h + c:
            t.record_stream(caller)
    return torch.cat(pieces, dim=0), h, c
