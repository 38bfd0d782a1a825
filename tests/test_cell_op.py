"""torch.ops.pipelstm.lstm_cell_forward/backward against plain torch math."""

import pytest
import torch

import pipelstm
from reference import cell, rel_error

from pipelstm.ops import lstm_cell


def _inputs(B, H, dtype, bias=True, requires_grad=False):
    def make(*shape):
        return torch.randn(*shape, dtype=dtype, requires_grad=requires_grad)

    gi, gh, cx = make(B, 4 * H), make(B, 4 * H), make(B, H)
    b_ih, b_hh = (make(4 * H), make(4 * H)) if bias else (None, None)
    return gi, gh, cx, b_ih, b_hh


def _reference(gi, gh, cx, b_ih, b_hh):
    gates = gi + gh
    if b_ih is not None:
        gates = gates + b_ih + b_hh
    return cell(gates, cx)


@pytest.mark.parametrize("B,H", [(1, 1), (3, 5), (8, 64), (5, 33)])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_backward_fp32_matches_fp64_reference(B, H, bias):
    args = _inputs(B, H, torch.float32, bias, requires_grad=True)
    args64 = [a.detach().double().requires_grad_() if a is not None else None for a in args]
    hy, cy = lstm_cell(*args)
    hy_ref, cy_ref = _reference(*args64)
    assert rel_error(hy, hy_ref) <= 1e-5
    assert rel_error(cy, cy_ref) <= 1e-5

    gh, gc = torch.randn_like(hy_ref), torch.randn_like(cy_ref)
    leaves = [a for a in args if a is not None]
    leaves64 = [a for a in args64 if a is not None]
    grads = torch.autograd.grad((hy * gh.float()).sum() + (cy * gc.float()).sum(), leaves)
    grads_ref = torch.autograd.grad((hy_ref * gh).sum() + (cy_ref * gc).sum(), leaves64)
    for g, g_ref in zip(grads, grads_ref):
        assert rel_error(g, g_ref) <= 1e-5


def test_extreme_preactivations_stay_finite_and_exact():
    # Saturated gates: exp overflow in a naive sigmoid/tanh would give NaN.
    B, H = 2, 8
    gi = torch.tensor([-1e4, -100.0, -30.0, -1e-6, 0.0, 1e-6, 30.0, 1e4]).repeat(B, 4).double()
    gh = torch.zeros_like(gi)
    cx = torch.linspace(-3, 3, B * H, dtype=torch.double).view(B, H)
    hy_ref, cy_ref = _reference(gi, gh, cx, None, None)
    hy, cy = lstm_cell(gi.float(), gh.float(), cx.float())
    assert torch.isfinite(hy).all() and torch.isfinite(cy).all()
    assert rel_error(hy, hy_ref) <= 1e-5 and rel_error(cy, cy_ref) <= 1e-5


def _elementwise_rel(actual, expected):
    """The largest |actual - expected| / |expected| over the elements (where
    expected is 0, actual must be too)."""
    return ((actual.double() - expected).abs() / expected.abs().clamp_min(1e-30)).max().item()


def test_elementwise_accuracy_of_activations_fp32():
    # Every pre-activation in a dense range, compared element by element.
    x = torch.linspace(-20, 20, 40001, dtype=torch.double)
    H = x.numel()
    gates = torch.stack([x, torch.zeros_like(x), x, torch.full_like(x, 50.0)]).view(1, 4 * H)
    cx = torch.zeros(1, H, dtype=torch.double)
    # With f = sigmoid(0), o = 1: c = sigmoid(x) * tanh(x), h = tanh(c).
    hy_ref, cy_ref = _reference(gates, torch.zeros_like(gates), cx, None, None)
    hy, cy = lstm_cell(gates.float(), torch.zeros_like(gates).float(), cx.float())
    assert _elementwise_rel(cy, cy_ref) <= 1e-5
    assert _elementwise_rel(hy, hy_ref) <= 1e-5  # tanh(c), small |c| included (relative, not max-abs)


@pytest.mark.parametrize("bias", [True, False])
def test_gradcheck_and_gradgradcheck_fp64(bias):
    args = _inputs(3, 4, torch.float64, bias, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: lstm_cell(*a), args)
    assert torch.autograd.gradgradcheck(lambda *a: lstm_cell(*a), args)


def test_only_one_output_used():
    gi, gh, cx, b_ih, b_hh = _inputs(2, 3, torch.float64, True, requires_grad=True)
    hy, _ = lstm_cell(gi, gh, cx, b_ih, b_hh)
    hy_ref, _ = _reference(gi, gh, cx, b_ih, b_hh)
    g = torch.autograd.grad(hy.sum(), [gi, cx, b_ih])
    g_ref = torch.autograd.grad(hy_ref.sum(), [gi, cx, b_ih])
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)
