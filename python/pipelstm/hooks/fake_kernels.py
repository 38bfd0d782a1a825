"""Fake kernels of the pipelstm ops: the C++ checks, then shapes.

FakeTensor, ``torch.compile`` and ``torch.export`` trace the ops with these.
Each makes every check its C++ op makes (csrc/checks.cpp, layer_checks.cpp,
cell_ops.h), with the same messages, so that traced code fails where
eager fails. Only checks that read batch_sizes' values are left to the real
op. torch._check keeps them valid for symbolic sizes.
"""

from typing import Optional

import torch
from torch import Tensor

from ..geometry import LayerGeometry

__all__ = ["register"]


def _check_dim(op: str, name: str, t: Tensor, dim: int, layout: str) -> None:
    torch._check(
        t.dim() == dim,
        lambda: f"pipelstm::{op}: expected `{name}` to be {dim}-D {layout}, got a {t.dim()}-D tensor of shape "
        f"{list(t.shape)}",
    )


def _check_shape(op: str, name: str, t: Tensor, sizes) -> None:
    torch._check(
        t.dim() == len(sizes) and all(a == b for a, b in zip(t.shape, sizes)),
        lambda: f"pipelstm::{op}: expected `{name}` of shape {list(sizes)}, got {list(t.shape)}",
    )


def _check_same_kind(op: str, ref_name: str, ref: Tensor, **tensors: Optional[Tensor]) -> None:
    """Every given tensor has ref's dtype and device (mixed meta/real devices
    dispatch here rather than to the C++ kernel)."""
    for name, t in tensors.items():
        if t is None:
            continue
        torch._check(
            t.dtype == ref.dtype,
            lambda: f"pipelstm::{op}: expected `{name}` to have the dtype of `{ref_name}` ({ref.dtype}), got {t.dtype}",
        )
        torch._check(
            t.device == ref.device,
            lambda: f"pipelstm::{op}: expected `{name}` on the device of `{ref_name}` ({ref.device}), got {t.device}",
        )


def _check_supported_dtype(op: str, name: str, t: Tensor) -> None:
    torch._check(
        t.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64),
        lambda: f"pipelstm::{op}: `{name}` must be float32, float16, bfloat16 or float64, got {t.dtype}",
    )


def _computed_in_float32(ref: Tensor) -> bool:
    """csrc/float32_upcast.h's computed_in_float32: a bfloat16 or float16
    call on the CPU (or meta) runs the float32 kernels, and its workspace is
    float32 with the float32 state its backward reads appended
    (csrc/cpu/lstm_layer_cpu.cpp): a layer's output, a cell's cy."""
    return ref.dtype in (torch.bfloat16, torch.float16) and ref.device.type in ("cpu", "meta")


def _check_float32_workspace(op: str, ref: Tensor, workspace: Tensor, numel: int = 0) -> None:
    """A reduced-precision CPU call's workspace: float32, 1-D with at least
    ``numel`` elements (the appended output) for a layer."""
    torch._check(
        workspace.dtype == torch.float32 and (numel == 0 or (workspace.dim() == 1 and workspace.shape[0] >= numel)),
        lambda: f"pipelstm::{op}: expected `workspace` to be the {'1-D ' if numel else ''}float32 workspace of a "
        f"{ref.dtype} forward on the CPU, got a {workspace.dim()}-D {workspace.dtype} tensor of shape "
        f"{list(workspace.shape)}",
    )


def _layer_geometry(op, input, batch, h0, c0, w_ih, w_hh, w_hr, b_ih=None, b_hh=None) -> LayerGeometry:
    """csrc/layer_checks.cpp's check_weights and check_biases: -> the layer's geometry."""
    _check_dim(op, "w_ih", w_ih, 2, "[4H, I]")
    _check_supported_dtype(op, "input", input)
    torch._check(
        w_ih.shape[0] % 4 == 0 and w_ih.shape[0] > 0,
        lambda: f"pipelstm::{op}: expected `w_ih` of shape [4H, I] with H > 0, got {list(w_ih.shape)}",
    )
    if w_hr is not None:
        _check_dim(op, "w_hr", w_hr, 2, "[P, H]")
    g = LayerGeometry.of(w_ih, w_hr)
    H, I, P = g.hidden_size, input.shape[-1], g.out_size
    if w_hr is not None:
        _check_shape(op, "w_hr", w_hr, (P, H))
    _check_shape(op, "w_ih", w_ih, (4 * H, I))
    _check_shape(op, "w_hh", w_hh, (4 * H, P))
    _check_shape(op, "h0", h0, (batch, P))
    _check_shape(op, "c0", c0, (batch, H))
    for name, bias in (("b_ih", b_ih), ("b_hh", b_hh)):
        if bias is not None:
            _check_shape(op, name, bias, (4 * H,))
    _check_same_kind(op, "input", input, w_hr=w_hr, w_ih=w_ih, w_hh=w_hh, h0=h0, c0=c0, b_ih=b_ih, b_hh=b_hh)
    return g


def _layer_workspace(input: Tensor, g: LayerGeometry, rows, out_numel) -> Tensor:
    if _computed_in_float32(input):
        return input.new_empty(g.workspace_numel(rows) + out_numel, dtype=torch.float32)
    return input.new_empty(g.workspace_numel(rows))


def _check_layer_grads(op, input, g: LayerGeometry, rows, batch, output, grad_output, grad_h_n, grad_c_n, workspace):
    """csrc/layer_checks.cpp's check_grads; for a reduced-precision CPU call
    after cpu/lstm_layer_cpu.cpp's checks, and on its workspace's float32
    part (the float32 output follows it)."""
    grads = dict(grad_output=grad_output, grad_h_n=grad_h_n, grad_c_n=grad_c_n)
    if _computed_in_float32(input):
        _check_same_kind(op, "input", input, output=output, **grads)
        _check_float32_workspace(op, input, workspace, output.numel())
        part = workspace.shape[0] - output.numel()
        torch._check(
            part == g.workspace_numel(rows),
            lambda: f"pipelstm::{op}: expected `workspace` of shape [{g.workspace_numel(rows)}], got [{part}]",
        )
    else:
        _check_shape(op, "workspace", workspace, (g.workspace_numel(rows),))
    if grad_output is not None:
        _check_shape(op, "grad_output", grad_output, tuple(output.shape))
    if grad_h_n is not None:
        _check_shape(op, "grad_h_n", grad_h_n, (batch, g.out_size))
    if grad_c_n is not None:
        _check_shape(op, "grad_c_n", grad_c_n, (batch, g.hidden_size))
    if not _computed_in_float32(input):
        _check_same_kind(op, "input", input, output=output, workspace=workspace, **grads)


def _check_batch_sizes(op: str, input: Tensor, batch_sizes: Tensor) -> None:
    _check_dim(op, "input", input, 2, "[rows, I] (PackedSequence.data)")
    torch._check(
        batch_sizes.dim() == 1 and batch_sizes.device.type == "cpu" and batch_sizes.dtype == torch.int64,
        lambda: f"pipelstm::{op}: expected `batch_sizes` to be a 1-D int64 CPU tensor, got "
        f"{batch_sizes.dim()}-D {batch_sizes.dtype} on {batch_sizes.device}",
    )
    torch._check(batch_sizes.numel() > 0, lambda: f"pipelstm::{op}: expected `batch_sizes` with at least one time step")


def _check_cell(op, cx, gates, grads, biases=()):
    _check_dim(op, "cx", cx, 2, "[B, H]")
    B, H = cx.shape
    for name, t in gates:
        _check_shape(op, name, t, (B, 4 * H))
    _check_supported_dtype(op, "cx", cx)
    for name, t in grads:
        if t is not None:
            _check_shape(op, name, t, (B, H))
    for name, t in biases:
        if t is not None:
            _check_shape(op, name, t, (4 * H,))
    _check_same_kind(op, "cx", cx, **dict(gates), **dict(grads), **dict(biases))
    return B, H


def _fake_lstm_cell_forward(input_gates, hidden_gates, cx, b_ih, b_hh):
    op = "lstm_cell_forward"
    _check_dim(op, "input_gates", input_gates, 2, "[B, 4H]")
    B, H = _check_cell(op, cx, [("input_gates", input_gates), ("hidden_gates", hidden_gates)], [],
                       [("b_ih", b_ih), ("b_hh", b_hh)])
    if _computed_in_float32(cx):  # the activated gates, then the float32 cy
        return cx.new_empty(B, H), cx.new_empty(B, H), cx.new_empty(B, 5 * H, dtype=torch.float32)
    return cx.new_empty(B, H), cx.new_empty(B, H), cx.new_empty(B, 4 * H)


def _fake_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace):
    op = "lstm_cell_backward"
    states = [("cy", cy), ("grad_hy", grad_hy), ("grad_cy", grad_cy)]
    if _computed_in_float32(cx):
        _check_same_kind(op, "cx", cx, **dict(states))
        B, H = _check_cell(op, cx, [], states)
        _check_float32_workspace(op, cx, workspace)
        _check_shape(op, "workspace", workspace, (B, 5 * H))
        return workspace.new_empty(B, 4 * H), workspace.new_empty(B, H)  # float32
    B, H = _check_cell(op, cx, [("workspace", workspace)], states)
    return cx.new_empty(B, 4 * H), cx.new_empty(B, H)


def _fake_lstm_layer_forward(input, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    op = "lstm_layer_forward"
    _check_dim(op, "input", input, 3, "[T, B, I]")
    T, B, _ = input.shape
    torch._check(T > 0, lambda: f"pipelstm::{op}: expected `input` with at least one time step, got {list(input.shape)}")
    g = _layer_geometry(op, input, B, h0, c0, w_ih, w_hh, w_hr, b_ih, b_hh)
    return (
        input.new_empty(T, B, g.out_size),
        input.new_empty(B, g.out_size),
        input.new_empty(B, g.hidden_size),
        _layer_workspace(input, g, T * B, T * B * g.out_size),
    )


def _layer_grads(input, h0, c0, w_ih, w_hh, w_hr, H):
    return (
        input.new_empty(input.shape),
        input.new_empty(h0.shape),
        input.new_empty(c0.shape),
        input.new_empty(w_ih.shape),
        input.new_empty(w_hh.shape),
        input.new_empty(4 * H),
        input.new_empty(w_hr.shape) if w_hr is not None else input.new_empty(0),
    )


def _fake_lstm_layer_backward(grad_output, grad_h_n, grad_c_n, input, h0, c0, w_ih, w_hh, w_hr, output, workspace, reverse):
    op = "lstm_layer_backward"
    _check_dim(op, "input", input, 3, "[T, B, I]")
    T, B, _ = input.shape
    g = _layer_geometry(op, input, B, h0, c0, w_ih, w_hh, w_hr)
    _check_shape(op, "output", output, (T, B, g.out_size))
    _check_layer_grads(op, input, g, T * B, B, output, grad_output, grad_h_n, grad_c_n, workspace)
    return _layer_grads(input, h0, c0, w_ih, w_hh, w_hr, g.hidden_size)


def _fake_lstm_packed_layer_forward(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    op = "lstm_packed_layer_forward"
    _check_batch_sizes(op, input, batch_sizes)
    rows, B = input.shape[0], h0.shape[0]  # B is batch_sizes[0]: the real op checks h0 against it
    g = _layer_geometry(op, input, B, h0, c0, w_ih, w_hh, w_hr, b_ih, b_hh)
    return (
        input.new_empty(rows, g.out_size),
        input.new_empty(B, g.out_size),
        input.new_empty(B, g.hidden_size),
        _layer_workspace(input, g, rows, rows * g.out_size),
    )


def _fake_lstm_packed_layer_backward(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh, w_hr, output, workspace, reverse):
    op = "lstm_packed_layer_backward"
    _check_batch_sizes(op, input, batch_sizes)
    rows, B = input.shape[0], h0.shape[0]
    g = _layer_geometry(op, input, B, h0, c0, w_ih, w_hh, w_hr)
    _check_shape(op, "output", output, (rows, g.out_size))
    _check_layer_grads(op, input, g, rows, B, output, grad_output, grad_h_n, grad_c_n, workspace)
    return _layer_grads(input, h0, c0, w_ih, w_hh, w_hr, g.hidden_size)


def _zoneout_geometry(op, input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h):
    """csrc/zoneout_layer_ops.h's checks: -> (geometry, rows, output shape)."""
    if batch_sizes is None:
        _check_dim(op, "input", input, 3, "[T, B, I]")
        T, B, _ = input.shape
        torch._check(T > 0, lambda: f"pipelstm::{op}: expected `input` with at least one time step, got {list(input.shape)}")
        rows = T * B
    else:
        _check_batch_sizes(op, input, batch_sizes)
        rows, B = input.shape[0], h0.shape[0]
    torch._check(not _computed_in_float32(input), lambda: f"pipelstm::{op}: zoneout on the CPU computes in float32 "
                 f"or float64, got an `input` of {input.dtype}")
    g = _layer_geometry(op, input, B, h0, c0, w_ih, w_hh, None, b_ih, b_hh)
    _check_same_kind(op, "input", input, keep_c=keep_c, keep_h=keep_h)
    for name, keep in (("keep_c", keep_c), ("keep_h", keep_h)):
        if keep is None:  # the LayerNorm op's without zoneout
            continue
        torch._check(keep.dim() >= 1 and keep.shape[-1] == g.hidden_size and keep.numel() == rows * g.hidden_size,
                     lambda: f"pipelstm::{op}: expected `{name}` with {rows} rows of {g.hidden_size} keep weights")
    return g, rows, ((T, B, g.hidden_size) if batch_sizes is None else (rows, g.hidden_size))


def _fake_lstm_zoneout_layer_forward(input, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, keep_c, keep_h, reverse):
    g, rows, out_shape = _zoneout_geometry("lstm_zoneout_layer_forward", input, batch_sizes, h0, c0, w_ih, w_hh,
                                           b_ih, b_hh, keep_c, keep_h)
    B = h0.shape[0]
    return (input.new_empty(out_shape), input.new_empty(B, g.hidden_size), input.new_empty(B, g.hidden_size),
            input.new_empty(g.workspace_numel(rows)))


def _fake_lstm_zoneout_layer_backward(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh,
                                      keep_c, keep_h, output, workspace, reverse):
    op = "lstm_zoneout_layer_backward"
    g, rows, out_shape = _zoneout_geometry(op, input, batch_sizes, h0, c0, w_ih, w_hh, None, None, keep_c, keep_h)
    _check_shape(op, "output", output, out_shape)
    _check_layer_grads(op, input, g, rows, h0.shape[0], output, grad_output, grad_h_n, grad_c_n, workspace)
    return _layer_grads(input, h0, c0, w_ih, w_hh, None, g.hidden_size)[:6]


def _layernorm_geometry(op, input, batch_sizes, h0, c0, w_ih, w_hh, gamma_ih, gamma_hh, gamma_c, keep_c, keep_h):
    """csrc/layernorm_layer_loop.h's checks: -> (geometry, rows, output shape)."""
    torch._check(input.dtype in (torch.float32, torch.float64), lambda: f"pipelstm::{op}: the fused LayerNorm "
                 f"LSTM computes in float32 or float64, got an `input` of {input.dtype}")
    g, rows, out_shape = _zoneout_geometry(op, input, batch_sizes, h0, c0, w_ih, w_hh, None, None, keep_c, keep_h)
    H = g.hidden_size
    for name, t, n in (("gamma_ih", gamma_ih, 4 * H), ("gamma_hh", gamma_hh, 4 * H), ("gamma_c", gamma_c, H)):
        _check_shape(op, name, t, (n,))
        _check_same_kind(op, "input", input, **{name: t})
    return g, rows, out_shape


def _fake_lstm_layernorm_layer_forward(input, batch_sizes, h0, c0, w_ih, w_hh, bias, gamma_ih, gamma_hh, gamma_c,
                                       beta_c, keep_c, keep_h, reverse, eps):
    from ..layernorm_ops import workspace_numel

    g, rows, out_shape = _layernorm_geometry("lstm_layernorm_layer_forward", input, batch_sizes, h0, c0, w_ih, w_hh,
                                             gamma_ih, gamma_hh, gamma_c, keep_c, keep_h)
    B, H = h0.shape[0], g.hidden_size
    return (input.new_empty(out_shape), input.new_empty(B, H), input.new_empty(B, H),
            input.new_empty(workspace_numel(rows, H)))


def _fake_lstm_layernorm_layer_backward(grad_output, grad_h_n, grad_c_n, input, batch_sizes, h0, c0, w_ih, w_hh,
                                        gamma_ih, gamma_hh, gamma_c, keep_c, keep_h, output, workspace, reverse):
    from ..layernorm_ops import workspace_numel

    op = "lstm_layernorm_layer_backward"
    g, rows, out_shape = _layernorm_geometry(op, input, batch_sizes, h0, c0, w_ih, w_hh, gamma_ih, gamma_hh, gamma_c,
                                             keep_c, keep_h)
    _check_shape(op, "output", output, out_shape)
    _check_shape(op, "workspace", workspace, (workspace_numel(rows, g.hidden_size),))
    H = g.hidden_size
    return (*_layer_grads(input, h0, c0, w_ih, w_hh, None, H)[:6], input.new_empty(4 * H), input.new_empty(4 * H),
            input.new_empty(H), input.new_empty(H))


def _fake_bernoulli_mask(seed, size, p, below, above, dtype):
    op = "bernoulli_mask"
    torch._check(seed.dim() == 0 and seed.dtype == torch.int64,
                 lambda: f"pipelstm::{op}: expected `seed` to be a 0-dim int64 tensor, got a {seed.dim()}-D "
                 f"{seed.dtype} tensor")
    torch._check(0.0 <= p <= 1.0, lambda: f"pipelstm::{op}: expected p in [0, 1], got {p}")
    return seed.new_empty(size, dtype=dtype)


_FAKE_KERNELS = {
    "pipelstm::lstm_cell_forward": _fake_lstm_cell_forward,
    "pipelstm::lstm_cell_backward": _fake_lstm_cell_backward,
    "pipelstm::lstm_layer_forward": _fake_lstm_layer_forward,
    "pipelstm::lstm_layer_backward": _fake_lstm_layer_backward,
    "pipelstm::lstm_packed_layer_forward": _fake_lstm_packed_layer_forward,
    "pipelstm::lstm_packed_layer_backward": _fake_lstm_packed_layer_backward,
    "pipelstm::lstm_zoneout_layer_forward": _fake_lstm_zoneout_layer_forward,
    "pipelstm::lstm_zoneout_layer_backward": _fake_lstm_zoneout_layer_backward,
    "pipelstm::lstm_layernorm_layer_forward": _fake_lstm_layernorm_layer_forward,
    "pipelstm::lstm_layernorm_layer_backward": _fake_lstm_layernorm_layer_backward,
    "pipelstm::bernoulli_mask": _fake_bernoulli_mask,
}


def register() -> None:
    """Registers the fake kernels with torch.library (pipelstm's import
    does, once)."""
    for name, kernel in _FAKE_KERNELS.items():
        torch.library.register_fake(name)(kernel)
