"""The fused CPU time loops (csrc/cpu/fused_loops_cpu.cpp) across threads:
with two or more threads and enough batch rows the forward and the backward
of dense input run blocks of rows as whole loops of their own (row blocks),
otherwise they split each step's panels. Either way every row goes through the same kernel calls, so
the results equal the one-thread loop's bitwise, and float64 math within
float32 rounding."""

import pytest
import torch

import pipelstm  # noqa: F401  (registers torch.ops.pipelstm)
from reference import layer, num_threads, packed_layer, rel_error

forward = torch.ops.pipelstm.lstm_layer_forward
packed_forward = torch.ops.pipelstm.lstm_packed_layer_forward
backward = torch.ops.pipelstm.lstm_layer_backward
packed_backward = torch.ops.pipelstm.lstm_packed_layer_backward
GRADS = ["input", "h0", "c0", "w_ih", "w_hh", "bias", "w_hr"]  # the backward ops' outputs


def _weights(I, H, P, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.rand(*s, generator=g) - 0.5) * 0.6  # noqa: E731
    w = dict(w_ih=r(4 * H, I), w_hh=r(4 * H, P or H), b_ih=r(4 * H), b_hh=r(4 * H))
    w["w_hr"] = r(P, H) if P else None
    return w


def _args(w):
    return w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], w["w_hr"]


@pytest.mark.parametrize("B", [16, 24, 37])
@pytest.mark.parametrize("P", [0, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_dense_forward_on_two_threads_equals_one_thread_and_float64(B, P, reverse):
    T, I, H = 9, 7, 16
    w = _weights(I, H, P)
    x = torch.randn(T, B, I)
    h0, c0 = torch.randn(B, P or H), torch.randn(B, H)
    with num_threads(1):
        one = forward(x, h0, c0, *_args(w), reverse)
    with num_threads(2):
        two = forward(x, h0, c0, *_args(w), reverse)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
    ref = layer(x.double(), h0.double(), c0.double(), **{k: None if v is None else v.double() for k, v in w.items()},
                reverse=reverse)
    for got, want in zip(two[:3], ref):
        assert rel_error(got.double(), want) < 1e-5


@pytest.mark.parametrize("reverse", [False, True])
def test_packed_forward_on_two_threads_equals_one_thread_and_float64(reverse):
    I, H = 6, 12
    sizes = [20, 20, 17, 16, 9, 8, 3, 1]  # rows leave the blocks at different steps
    w = _weights(I, H, 0, seed=1)
    data = torch.randn(sum(sizes), I)
    batch_sizes = torch.tensor(sizes)
    h0, c0 = torch.randn(sizes[0], H), torch.randn(sizes[0], H)
    with num_threads(1):
        one = packed_forward(data, batch_sizes, h0, c0, *_args(w), reverse)
    with num_threads(2):
        two = packed_forward(data, batch_sizes, h0, c0, *_args(w), reverse)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
    ref = packed_layer(data.double(), sizes, h0.double(), c0.double(), reverse=reverse,
                       **{k: None if v is None else v.double() for k, v in w.items()})
    for got, want in zip(two[:3], ref):
        assert rel_error(got.double(), want) < 1e-5


def _float64(w):
    return {k: None if v is None else v.double().requires_grad_() for k, v in w.items()}


def _reference_grads(run, leaves, w64, seeds):
    """The float64 gradients of run() (output, h_n, c_n) against `seeds`, in
    the backward ops' order (one bias gradient: b_ih's, equal to b_hh's;
    None for w_hr without a projection, where the ops give an empty tensor)."""
    loss = sum((y * g.double()).sum() for y, g in zip(run(), seeds))
    wanted = [*leaves, w64["w_ih"], w64["w_hh"], w64["b_ih"]] + ([w64["w_hr"]] if w64["w_hr"] is not None else [])
    got = torch.autograd.grad(loss, wanted)
    return list(got) + ([None] if w64["w_hr"] is None else [])


def _check_two_threads(grads, one, splits, monkeypatch):
    """grads() on two threads under each PIPELSTM_ROW_SPLIT in `splits` (None:
    unset) equals `one` (one thread) bitwise. But for w_hr's: its ATen GEMM
    sums over all rows in an order that depends on the thread count, so it
    is compared only across the two-thread runs."""
    first = None
    for split in splits:
        if split is None:
            monkeypatch.delenv("PIPELSTM_ROW_SPLIT", raising=False)
        else:
            monkeypatch.setenv("PIPELSTM_ROW_SPLIT", split)
        with num_threads(2):
            two = grads()
        first = first or two
        for name, a, b, b0 in zip(GRADS, one, two, first):
            assert torch.equal(b0 if name == "w_hr" else a, b), (split, name)
    monkeypatch.delenv("PIPELSTM_ROW_SPLIT", raising=False)


@pytest.mark.parametrize("B,H", [(16, 16), (24, 16), (37, 16), (16, 64)])
@pytest.mark.parametrize("P", [0, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_dense_backward_on_two_threads_equals_one_thread_and_float64(B, H, P, reverse, monkeypatch):
    # Two threads: row blocks by default (B >= 16) and with PIPELSTM_ROW_SPLIT=1,
    # panels with =0 (split over two threads at H=64, one at H=16).
    T, I = 9, 7
    w = _weights(I, H, P, seed=2)
    x = torch.randn(T, B, I)
    h0, c0 = torch.randn(B, P or H), torch.randn(B, H)
    seeds = [torch.randn(T, B, P or H), torch.randn(B, P or H), torch.randn(B, H)]

    def grads():
        out, h_n, c_n, ws = forward(x, h0, c0, *_args(w), reverse)
        return backward(*seeds, x, h0, c0, w["w_ih"], w["w_hh"], w["w_hr"], out, ws, reverse)

    monkeypatch.delenv("PIPELSTM_ROW_SPLIT", raising=False)
    with num_threads(1):
        one = grads()
    _check_two_threads(grads, one, [None, "1", "0"], monkeypatch)

    w64 = _float64(w)
    x64, h064, c064 = (v.double().requires_grad_() for v in (x, h0, c0))
    ref = _reference_grads(lambda: layer(x64, h064, c064, **w64, reverse=reverse), [x64, h064, c064], w64, seeds)
    for name, got, want in zip(GRADS, one, ref):
        assert got.numel() == 0 if want is None else rel_error(got.double(), want) < 1e-5, name


@pytest.mark.parametrize("P", [0, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_packed_backward_on_two_threads_equals_one_thread_and_float64(P, reverse, monkeypatch):
    # Packed input splits panels even with PIPELSTM_ROW_SPLIT=1.
    I, H = 6, 12
    sizes = [20, 20, 17, 16, 9, 8, 3, 1]
    w = _weights(I, H, P, seed=3)
    data = torch.randn(sum(sizes), I)
    batch_sizes = torch.tensor(sizes)
    h0, c0 = torch.randn(sizes[0], P or H), torch.randn(sizes[0], H)
    seeds = [torch.randn(sum(sizes), P or H), torch.randn(sizes[0], P or H), torch.randn(sizes[0], H)]

    def grads():
        out, h_n, c_n, ws = packed_forward(data, batch_sizes, h0, c0, *_args(w), reverse)
        return packed_backward(*seeds, data, batch_sizes, h0, c0, w["w_ih"], w["w_hh"], w["w_hr"], out, ws,
                               reverse)

    monkeypatch.delenv("PIPELSTM_ROW_SPLIT", raising=False)
    with num_threads(1):
        one = grads()
    _check_two_threads(grads, one, [None, "1"], monkeypatch)

    w64 = _float64(w)
    d64, h064, c064 = (v.double().requires_grad_() for v in (data, h0, c0))
    ref = _reference_grads(lambda: packed_layer(d64, sizes, h064, c064, reverse=reverse, **w64),
                           [d64, h064, c064], w64, seeds)
    for name, got, want in zip(GRADS, one, ref):
        assert got.numel() == 0 if want is None else rel_error(got.double(), want) < 1e-5, name
