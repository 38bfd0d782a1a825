"""The fused CPU time loops (csrc/cpu/fused_loops_cpu.cpp) across threads:
with two or more threads and enough batch rows the forward runs blocks of
rows as whole loops of their own (row blocks), otherwise it splits each
step's panels. Either way every row goes through the same kernel calls, so
the results equal the one-thread loop's bitwise, and float64 math within
float32 rounding."""

import pytest
import torch

import pipelstm  # noqa: F401  (registers torch.ops.pipelstm)
from reference import layer, num_threads, packed_layer, rel_error

forward = torch.ops.pipelstm.lstm_layer_forward
packed_forward = torch.ops.pipelstm.lstm_packed_layer_forward


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
