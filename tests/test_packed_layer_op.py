"""torch.ops.pipelstm.lstm_packed_layer_*: each sequence as if run alone."""

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import pipelstm  # noqa: F401
from pipelstm.ops import lstm_packed_layer
from reference import packed_layer, rel_error

ops = torch.ops.pipelstm


def _packed_case(lengths, I, H, P, bias, dtype, requires_grad=True):
    seqs = [torch.randn(n, I, dtype=dtype) for n in lengths]
    packed = pack_sequence(seqs, enforce_sorted=False)
    B, Hout = len(lengths), P or H

    def rnd(*s):
        return (torch.randn(*s, dtype=dtype) * 0.5).requires_grad_(requires_grad)

    w = dict(
        w_ih=rnd(4 * H, I), w_hh=rnd(4 * H, Hout), b_ih=rnd(4 * H) if bias else None,
        b_hh=rnd(4 * H) if bias else None, w_hr=rnd(Hout, H) if P else None,
    )
    h0, c0 = rnd(B, Hout), rnd(B, H)  # in sorted order, as the op sees them
    data = packed.data.clone().requires_grad_(requires_grad)
    return packed, data, h0, c0, w


def _reference(packed, data, h0, c0, w, reverse):
    """Runs each sequence alone with plain torch math; returns packed rows."""
    return packed_layer(data, packed.batch_sizes.tolist(), h0, c0, reverse, **w)


@pytest.mark.parametrize("lengths", [[5, 2, 7, 1, 7], [3], [4, 4, 4], [1, 1, 6]])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("P,bias", [(0, True), (2, True), (0, False)])
def test_matches_each_sequence_run_alone(lengths, reverse, P, bias):
    packed, data, h0, c0, w = _packed_case(lengths, 3, 4, P, bias, torch.float64)
    out, h_n, c_n = lstm_packed_layer(data, packed.batch_sizes, h0, c0, **w, reverse=reverse)
    ref = _reference(packed, data, h0, c0, w, reverse)
    for a, b in zip((out, h_n, c_n), ref):
        assert rel_error(a, b) <= 1e-12

    gs = [torch.randn_like(r) for r in ref]
    leaves = [data, h0, c0] + [v for v in w.values() if v is not None]
    grads = torch.autograd.grad(sum((a * g).sum() for a, g in zip((out, h_n, c_n), gs)), leaves)
    grads_ref = torch.autograd.grad(sum((a * g).sum() for a, g in zip(ref, gs)), leaves)
    for g, g_r in zip(grads, grads_ref):
        assert rel_error(g, g_r) <= 1e-12


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_fp64(reverse):
    packed, data, h0, c0, w = _packed_case([3, 1, 2], 2, 3, 2, True, torch.float64)
    names = list(w)

    def fn(data, h0, c0, *ws):
        return lstm_packed_layer(data, packed.batch_sizes, h0, c0, **dict(zip(names, ws)), reverse=reverse)

    assert torch.autograd.gradcheck(fn, (data, h0, c0, *w.values()))


@pytest.mark.parametrize("reverse", [False, True])
def test_opcheck(reverse):
    packed, data, h0, c0, w = _packed_case([4, 2, 3], 3, 4, 0, True, torch.float64)
    args = (data, packed.batch_sizes, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], None, reverse)
    torch.library.opcheck(ops.lstm_packed_layer_forward, args)
    out, h_n, c_n, ws = ops.lstm_packed_layer_forward(*args)
    torch.library.opcheck(
        ops.lstm_packed_layer_backward,
        (torch.randn_like(out), torch.randn_like(h_n), None, data.detach(), packed.batch_sizes, h0.detach(),
         c0.detach(), w["w_ih"].detach(), w["w_hh"].detach(), None, out.detach(), ws, reverse),
    )


@pytest.mark.parametrize(
    "batch_sizes,pattern",
    [
        (torch.tensor([2, 3]), "positive and non-increasing"),
        (torch.tensor([3, 0]), "positive and non-increasing"),
        (torch.tensor([3.0, 2.0]), "1-D int64 CPU"),
        (torch.tensor([3, 2, 1]), r"`input` with 6 rows"),
    ],
)
def test_bad_batch_sizes(batch_sizes, pattern):
    data = torch.randn(5, 3)
    w_ih, w_hh = torch.randn(16, 3), torch.randn(16, 4)
    with pytest.raises(RuntimeError, match=pattern):
        ops.lstm_packed_layer_forward(data, batch_sizes, torch.zeros(3, 4), torch.zeros(3, 4), w_ih, w_hh, None, None, None, False)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("P", [0, 2])
def test_gradcheck_and_gradgradcheck_fp64(reverse, P):
    packed, data, h0, c0, w = _packed_case([3, 1, 2], 2, 3, P, True, torch.float64)
    names = [k for k, v in w.items() if v is not None]

    def fn(data, h0, c0, *weights):
        kw = dict(w, **dict(zip(names, weights)))
        return lstm_packed_layer(data, packed.batch_sizes, h0, c0, **kw, reverse=reverse)

    leaves = (data, h0, c0, *[w[k] for k in names])
    assert torch.autograd.gradcheck(fn, leaves)
    assert torch.autograd.gradgradcheck(fn, leaves)

