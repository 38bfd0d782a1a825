"""torch.ops.pipelstm.lstm_layer_forward/backward against nn.LSTM and fp64 math."""

import itertools

import pytest
import torch

import pipelstm
from pipelstm.ops import lstm_layer
from reference import layer, rel_error

CONFIGS = [
    (sizes, P, reverse, bias)
    for sizes, P, reverse, bias in itertools.product(
        [(1, 1, 1, 1), (5, 3, 4, 6), (7, 2, 9, 16), (3, 1, 8, 33)],  # T, B, I, H
        [0, 3],  # projection size
        [False, True],  # reverse
        [True, False],  # bias
    )
    if P < sizes[3]  # a projection must be smaller than the hidden size
]


def _make(T, B, I, H, P, bias, dtype, requires_grad=True):
    Hout = P or H

    def rnd(*shape):
        return (torch.randn(*shape, dtype=dtype) * 0.5).requires_grad_(requires_grad)

    return dict(
        input=rnd(T, B, I),
        h0=rnd(B, Hout),
        c0=rnd(B, H),
        w_ih=rnd(4 * H, I),
        w_hh=rnd(4 * H, Hout),
        b_ih=rnd(4 * H) if bias else None,
        b_hh=rnd(4 * H) if bias else None,
        w_hr=rnd(Hout, H) if P else None,
    )


def _leaves(args):
    return [v for v in args.values() if v is not None]


@pytest.mark.parametrize("sizes,P,reverse,bias", CONFIGS)
def test_fp32_matches_fp64_reference(sizes, P, reverse, bias):
    T, B, I, H = sizes
    args = _make(T, B, I, H, P, bias, torch.float32)
    args64 = {k: (v.detach().double().requires_grad_() if v is not None else None) for k, v in args.items()}
    out, h_n, c_n = lstm_layer(**args, reverse=reverse)
    out_r, h_r, c_r = layer(**{("x" if k == "input" else k): v for k, v in args64.items()}, reverse=reverse)
    for a, b in [(out, out_r), (h_n, h_r), (c_n, c_r)]:
        assert rel_error(a, b) <= 1e-5

    g_out, g_h, g_c = torch.randn_like(out_r), torch.randn_like(h_r), torch.randn_like(c_r)
    loss = (out * g_out.float()).sum() + (h_n * g_h.float()).sum() + (c_n * g_c.float()).sum()
    loss_r = (out_r * g_out).sum() + (h_r * g_h).sum() + (c_r * g_c).sum()
    grads = torch.autograd.grad(loss, _leaves(args))
    grads_r = torch.autograd.grad(loss_r, _leaves(args64))
    for name, g, g_r in zip([k for k, v in args.items() if v is not None], grads, grads_r):
        assert rel_error(g, g_r) <= 1e-5, name


@pytest.mark.parametrize("P,reverse", [(0, False), (0, True), (2, False), (2, True)])
def test_matches_nn_lstm_direction(P, reverse):
    T, B, I, H = 6, 3, 5, 4
    m = torch.nn.LSTM(I, H, proj_size=P, bidirectional=reverse).double()
    x = torch.randn(T, B, I, dtype=torch.double)
    Hout = P or H
    D = 2 if reverse else 1
    h0, c0 = torch.randn(D, B, Hout, dtype=torch.double), torch.randn(D, B, H, dtype=torch.double)
    out_ref, (h_ref, c_ref) = m(x, (h0, c0))
    d = D - 1
    suffix = "_reverse" if reverse else ""
    w = [getattr(m, f"{n}_l0{suffix}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    w_hr = getattr(m, f"weight_hr_l0{suffix}") if P else None
    out, h_n, c_n = lstm_layer(x, h0[d], c0[d], *w, w_hr=w_hr, reverse=reverse)
    torch.testing.assert_close(out, out_ref[..., d * Hout : (d + 1) * Hout], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_n, h_ref[d], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c_n, c_ref[d], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("P,reverse,bias", [(0, False, True), (2, True, True), (0, True, False), (2, False, False)])
def test_gradcheck_and_gradgradcheck_fp64(P, reverse, bias):
    args = _make(3, 2, 3, 4, P, bias, torch.float64)
    names = list(args)

    def fn(*leaves):
        it = iter(leaves)
        kw = {k: (next(it) if args[k] is not None else None) for k in names}
        return lstm_layer(**kw, reverse=reverse)

    assert torch.autograd.gradcheck(fn, _leaves(args))
    # Second order (create_graph=True differentiates the op's composition).
    assert torch.autograd.gradgradcheck(fn, _leaves(args))


def test_only_h_n_used_and_no_grad_for_constants():
    args = _make(4, 2, 3, 5, 0, True, torch.float64, requires_grad=False)
    args["w_hh"].requires_grad_()
    _, h_n, _ = lstm_layer(**args)
    (g,) = torch.autograd.grad(h_n.sum(), [args["w_hh"]])
    w = args["w_hh"].detach().requires_grad_()
    _, h_r, _ = layer(args["input"], args["h0"], args["c0"], args["w_ih"], w, args["b_ih"], args["b_hh"])
    (g_r,) = torch.autograd.grad(h_r.sum(), [w])
    torch.testing.assert_close(g, g_r)


def test_non_contiguous_inputs_give_the_same_result():
    args = _make(5, 3, 4, 6, 0, True, torch.float64, requires_grad=False)
    ref = lstm_layer(**args)
    strided = dict(args)
    strided["input"] = args["input"].transpose(0, 1).contiguous().transpose(0, 1)
    strided["w_ih"] = args["w_ih"].t().contiguous().t()
    strided["h0"] = args["h0"].t().contiguous().t()
    assert not strided["input"].is_contiguous()
    for a, b in zip(lstm_layer(**strided), ref):
        torch.testing.assert_close(a, b)


def test_empty_batch():
    args = _make(3, 0, 4, 5, 0, True, torch.float32, requires_grad=False)
    out, h_n, c_n = lstm_layer(**args)
    assert out.shape == (3, 0, 5) and h_n.shape == (0, 5) and c_n.shape == (0, 5)


@pytest.mark.parametrize("reverse", [False, True])
def test_fp32_at_sizes_that_take_the_onednn_gemm_path(reverse):
    # B * 4H * H = 16.7M multiply-adds per step: above PreparedLinear's
    # threshold, so on a CPU torch with oneDNN the GEMMs go through it.
    T, B, I, H = 3, 64, 256, 256
    args = _make(T, B, I, H, 0, True, torch.float32)
    args64 = {k: (v.detach().double().requires_grad_() if v is not None else None) for k, v in args.items()}
    out, h_n, c_n = lstm_layer(**args, reverse=reverse)
    out_r, h_r, c_r = lstm_layer(**args64, reverse=reverse)
    for a, b in [(out, out_r), (h_n, h_r), (c_n, c_r)]:
        assert rel_error(a, b) <= 1e-5
    g = torch.randn_like(out_r)
    grads = torch.autograd.grad((out * g.float()).sum(), _leaves(args))
    grads_r = torch.autograd.grad((out_r * g).sum(), _leaves(args64))
    for a, b in zip(grads, grads_r):
        assert rel_error(a, b) <= 1e-5
