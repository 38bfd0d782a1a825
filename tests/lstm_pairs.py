"""nn.LSTM and pipelstm.LSTM side by side: the pairs, the loss and the
forward-and-gradients run the module tests share."""

import torch
from torch import nn

import pipelstm
from reference import rel_error

KW = dict(input_size=4, hidden_size=6, num_layers=2, bidirectional=True, proj_size=3)


def pair(dtype=torch.float32, **kw):
    """(nn.LSTM, pipelstm.LSTM) with the same weights."""
    kw = kw or KW
    ref = nn.LSTM(**kw).to(dtype)
    ours = pipelstm.LSTM(**kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def make_hx(m, batch, dtype=torch.float32):
    d = 2 if m.bidirectional else 1
    h0 = torch.randn(m.num_layers * d, batch, m.proj_size or m.hidden_size, dtype=dtype, requires_grad=True)
    c0 = torch.randn(m.num_layers * d, batch, m.hidden_size, dtype=dtype, requires_grad=True)
    return h0, c0


def _weights_like(t, seed):
    return torch.randn(t.shape, generator=torch.Generator().manual_seed(seed), dtype=t.dtype)


def weighted_loss(out, h, c):
    """A loss that depends on every output element with a distinct weight
    (a plain sum would hide sign and permutation errors in the gradients)."""
    return sum((t * _weights_like(t, k)).sum() for k, t in enumerate((out, h, c)))


def forward_and_grads(model, x, hx=None):
    """[output, h_n, c_n, d/dx, d/dh0, d/dc0, d/dparams...] of weighted_loss."""
    out, (h, c) = model(x, hx)
    leaves = [x, *(hx or ()), *model.parameters()]
    grads = torch.autograd.grad(weighted_loss(out, h, c), leaves)
    return [out, h, c, *grads]


def assert_all_close(actual, expected, tol):
    assert len(actual) == len(expected)
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert a.shape == e.shape, k
        err = rel_error(a, e)
        assert err <= tol, f"item {k}: relative error {err:.3g} > {tol}"
