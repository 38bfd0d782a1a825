"""The LayerNorm LSTM layer op: its typed wrapper and the composition of
torch ops it runs where the fused op does not (its autograd formula is C++,
csrc/layernorm_autograd.cpp).

One direction of one layer (Ba et al. 2016, arXiv 1607.06450)::

    a    = gamma_ih * LN(x W_ih^T) + gamma_hh * LN(h_prev W_hh^T) + bias
    c    = sigmoid(a_f) * c_prev + sigmoid(a_i) * tanh(a_g)
    h    = sigmoid(a_o) * tanh(gamma_c * LN(c) + beta_c)

with ``LN`` the normalisation of ``torch.nn.LayerNorm`` (no affine part,
``eps``) over the 4H pre-activations or the H cells, and under zoneout ``c``
and ``h`` blended with the previous ones by keep weights.

The fused op (``torch.ops.pipelstm.lstm_layernorm_layer_forward``) runs in
float32 and float64, on the CPU and, in a CUDA build, on CUDA; a bfloat16 or
float16 call there is computed by it in float32 on float32 copies, its
results rounded once (the composition in those dtypes rounds the state at
every step and drifts far from the exact result). Everywhere else (torch.func
transforms, forward-mode AD, ONNX export) the layer is the composition below,
which autograd differentiates as any torch code; with ``create_graph=True``
the fused op's backward is that composition's, so it can be differentiated
again.
"""

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _C
from .hooks import export
from .op_autograd import REDUCED, composed, rounded_from_float32, unwrapped

__all__ = ["lstm_layernorm_layer", "workspace_numel"]

_ops = torch.ops.pipelstm


def workspace_numel(rows: int, hidden_size: int) -> int:
    """The fused forward's workspace (csrc/layernorm_layer_loop.h)."""
    return rows * (15 * hidden_size + 3)


def _fused(input: Tensor, *tensors: Optional[Tensor]) -> bool:
    """Whether the fused op computes this call (a bfloat16 or float16 one in float32)."""
    device = input.device.type == "cpu" or (input.device.type == "cuda" and _C.built_with_cuda())
    return (device and input.dtype in (torch.float32, torch.float64, *REDUCED)
            and not export.in_onnx_export() and not composed(input, *tensors))


def lstm_layernorm_layer(input: Tensor, batch_sizes: Optional[Tensor], h0: Tensor, c0: Tensor, w_ih: Tensor,
                         w_hh: Tensor, bias: Optional[Tensor], gamma_ih: Tensor, gamma_hh: Tensor, gamma_c: Tensor,
                         beta_c: Optional[Tensor], keep_c: Optional[Tensor] = None, keep_h: Optional[Tensor] = None,
                         reverse: bool = False, eps: float = 1e-5) -> Tuple[Tensor, Tensor, Tensor]:
    """One direction of one LayerNorm LSTM layer over ``input`` ``[T, B, I]``
    (``batch_sizes`` None) or a ``PackedSequence``'s rows ``[N, I]`` with its
    ``batch_sizes``, from ``(h0, c0)`` ``[B, H]``.

    ``bias`` is the sum of the two gate biases (``[4H]``); ``gamma_ih``,
    ``gamma_hh`` ``[4H]`` and ``gamma_c``, ``beta_c`` ``[H]`` the gains and
    bias of the three normalisations; ``keep_c``/``keep_h`` zoneout's keep
    weights of the output's shape (not differentiated), or None.

    Returns:
        ``(output, h_n, c_n)``: ``[T, B, H]`` (or ``[N, H]``), ``[B, H]``, ``[B, H]``.
    """
    tensors = (h0, c0, w_ih, w_hh, bias, gamma_ih, gamma_hh, gamma_c, beta_c)
    if not _fused(input, *tensors):
        return composed_layer(input, batch_sizes, *tensors, keep_c, keep_h, reverse, eps)
    if input.dtype in REDUCED:
        return rounded_from_float32(lstm_layernorm_layer, input.dtype, input, batch_sizes, *tensors, keep_c, keep_h,
                                    reverse, eps)
    output, h_n, c_n, _ = _ops.lstm_layernorm_layer_forward(input, batch_sizes, *tensors, keep_c, keep_h, reverse,
                                                            eps)
    return output, h_n, c_n


def composed_layer(input: Tensor, batch_sizes: Optional[Tensor], h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor,
                   bias: Optional[Tensor], gamma_ih: Tensor, gamma_hh: Tensor, gamma_c: Tensor,
                   beta_c: Optional[Tensor], keep_c: Optional[Tensor], keep_h: Optional[Tensor], reverse: bool,
                   eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`lstm_layernorm_layer` in torch ops, a step at a time. A dense
    input is the packed layout with B rows at every step; the state stays
    ``[B, H]``, each step updating the rows of the sequences it holds, so the
    rows it no longer (or not yet) holds keep their final (or initial) state."""
    dense = batch_sizes is None
    H = w_hh.shape[1]
    x = input.reshape(-1, input.shape[-1])
    sizes: List[int] = [input.shape[1]] * input.shape[0] if dense else unwrapped(batch_sizes).tolist()
    offsets = [0]
    for n in sizes[:-1]:
        offsets.append(offsets[-1] + n)
    x_norm = F.layer_norm(x @ w_ih.t(), (4 * H,), gamma_ih, None, eps)
    keeps = None if keep_c is None else (keep_c.reshape(-1, H), keep_h.reshape(-1, H))
    h, c = h0, c0
    outputs: List[Optional[Tensor]] = [None] * len(sizes)
    for t in (reversed(range(len(sizes))) if reverse else range(len(sizes))):
        n, row0 = sizes[t], offsets[t]
        h_prev, c_prev = h[:n], c[:n]
        a = x_norm[row0:row0 + n] + F.layer_norm(h_prev @ w_hh.t(), (4 * H,), gamma_hh, None, eps)
        if bias is not None:
            a = a + bias
        i, f, g, o = a.chunk(4, dim=1)
        c_new = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(F.layer_norm(c_new, (H,), gamma_c, beta_c, eps))
        if keeps is not None:
            c_new = c_new + keeps[0][row0:row0 + n] * (c_prev - c_new)
            h_new = h_new + keeps[1][row0:row0 + n] * (h_prev - h_new)
        outputs[t] = h_new
        h = torch.cat([h_new, h[n:]])
        c = torch.cat([c_new, c[n:]])
    output = torch.cat(outputs)
    return (output.view(input.shape[0], input.shape[1], H) if dense else output), h, c


# --- the composition as an op ---------------------------------------------------
# pipelstm::lstm_layernorm_layer_composite (its schema is C++'s) runs
# composed_layer: the op's create_graph=True backward (csrc/layernorm_autograd.cpp)
# differentiates it through the dispatcher. Held for as long as the module lives.
_library = torch.library.Library("pipelstm", "IMPL")


def register() -> None:
    """Registers the composition as the kernel of
    ``pipelstm::lstm_layernorm_layer_composite`` (pipelstm's import does, once)."""
    _library.impl("lstm_layernorm_layer_composite", composed_layer, "CompositeImplicitAutograd")
