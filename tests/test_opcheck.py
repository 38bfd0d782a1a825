"""torch.library.opcheck on every op: schema, fake kernel, autograd registration."""

import pytest
import torch

import pipelstm  # noqa: F401

ops = torch.ops.pipelstm


def _layer_args(P, bias, requires_grad):
    T, B, I, H = 4, 3, 5, 6
    Hout = P or H

    def rnd(*s):
        return torch.randn(*s, dtype=torch.float64, requires_grad=requires_grad)

    return [
        rnd(T, B, I),
        rnd(B, Hout),
        rnd(B, H),
        rnd(4 * H, I),
        rnd(4 * H, Hout),
        rnd(4 * H) if bias else None,
        rnd(4 * H) if bias else None,
        rnd(Hout, H) if P else None,
    ]


@pytest.mark.parametrize("P", [0, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_layer_forward(P, bias, reverse, requires_grad):
    torch.library.opcheck(ops.lstm_layer_forward, (*_layer_args(P, bias, requires_grad), reverse))


@pytest.mark.parametrize("P", [0, 2])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("grads", ["all", "output_only", "states_only"])
def test_layer_backward(P, reverse, grads):
    args = _layer_args(P, True, False)
    output, h_n, c_n, workspace = ops.lstm_layer_forward(*args, reverse)
    g_out = torch.randn_like(output) if grads != "states_only" else None
    g_h = torch.randn_like(h_n) if grads != "output_only" else None
    g_c = torch.randn_like(c_n) if grads != "output_only" else None
    input, h0, c0, w_ih, w_hh, _, _, w_hr = args
    torch.library.opcheck(
        ops.lstm_layer_backward,
        (g_out, g_h, g_c, input, h0, c0, w_ih, w_hh, w_hr, output, workspace, reverse),
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_cell_forward(bias, requires_grad):
    B, H = 3, 4

    def rnd(*s):
        return torch.randn(*s, dtype=torch.float64, requires_grad=requires_grad)

    b = (rnd(4 * H), rnd(4 * H)) if bias else (None, None)
    torch.library.opcheck(ops.lstm_cell_forward, (rnd(B, 4 * H), rnd(B, 4 * H), rnd(B, H), *b))


def test_cell_backward():
    B, H = 3, 4
    gi, gh, cx = torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H)
    hy, cy, ws = ops.lstm_cell_forward(gi, gh, cx, None, None)
    torch.library.opcheck(ops.lstm_cell_backward, (torch.randn_like(hy), None, cx, cy, ws))
    torch.library.opcheck(ops.lstm_cell_backward, (None, torch.randn_like(cy), cx, cy, ws))


def test_layer_compiles_fullgraph_and_matches_eager():
    args = _layer_args(2, True, True)

    def f(*a):
        out, h, c, _ = ops.lstm_layer_forward(*a, False)
        return out.sum() + h.sum() + c.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss, loss_c = f(*args), compiled(*args)
    torch.testing.assert_close(loss_c, loss)
    leaves = [a for a in args if a is not None]
    for g, g_c in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(loss_c, leaves)):
        torch.testing.assert_close(g_c, g)
