"""pipelstm.LSTM against torch.nn.LSTM: every option combination, forward and backward."""

import itertools
import random
import zlib

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from reference import rel_error

FORMS = ["seq_first", "batch_first", "unbatched", "unbatched_batch_first", "packed"]
COMBOS = list(
    itertools.product(
        [1, 2, 3],  # layers
        [False, True],  # bidirectional
        [False, True],  # projection
        [True, False],  # bias
        FORMS,
        [False, True],  # (h0, c0) given
    )
)
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def make_pair(dtype, **kw):
    ref = nn.LSTM(**kw).to(dtype)
    ours = pipelstm.LSTM(**kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def make_input(rng, form, B, T, I, dtype):
    if form == "packed":
        lengths = [rng.randint(1, T) for _ in range(B)]
        lengths[rng.randrange(B)] = T
        return pack_sequence([torch.randn(n, I, dtype=dtype) for n in lengths], enforce_sorted=False)
    if form.startswith("unbatched"):
        return torch.randn(T, I, dtype=dtype)
    return torch.randn(B, T, I, dtype=dtype) if form == "batch_first" else torch.randn(T, B, I, dtype=dtype)


def leaves_of(x):
    return x.data if isinstance(x, nn.utils.rnn.PackedSequence) else x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("layers,bidirectional,proj,bias,form,with_hx", COMBOS)
def test_matches_nn_lstm(dtype, layers, bidirectional, proj, bias, form, with_hx):
    rng = random.Random(zlib.crc32(repr((layers, bidirectional, proj, bias, form, with_hx)).encode()))
    torch.manual_seed(rng.randrange(1 << 30))
    I, H, T, B = rng.randint(1, 5), rng.randint(2, 6), rng.randint(1, 6), rng.randint(1, 4)
    P = rng.randint(1, H - 1) if proj else 0
    kw = dict(input_size=I, hidden_size=H, num_layers=layers, bias=bias, bidirectional=bidirectional,
              proj_size=P, batch_first=form.endswith("batch_first"))
    ref, ours = make_pair(dtype, **kw)

    x = make_input(rng, form, B, T, I, dtype)
    leaves_of(x).requires_grad_()
    args = [x]
    hx_leaves = []
    if with_hx:
        D = 2 if bidirectional else 1
        batch = [] if form.startswith("unbatched") else [B]
        h0 = torch.randn(D * layers, *batch, P or H, dtype=dtype, requires_grad=True)
        c0 = torch.randn(D * layers, *batch, H, dtype=dtype, requires_grad=True)
        args.append((h0, c0))
        hx_leaves = [h0, c0]

    out_r, (h_r, c_r) = ref(*args)
    out_o, (h_o, c_o) = ours(*args)
    if form == "packed":
        assert torch.equal(out_o.batch_sizes, out_r.batch_sizes)
        assert torch.equal(out_o.unsorted_indices, out_r.unsorted_indices)
        out_r, out_o = out_r.data, out_o.data
    assert out_o.shape == out_r.shape and h_o.shape == h_r.shape and c_o.shape == c_r.shape
    for a, b in [(out_o, out_r), (h_o, h_r), (c_o, c_r)]:
        assert rel_error(a, b) <= TOL[dtype]

    weights = [torch.randn_like(t) for t in (out_r, h_r, c_r)]
    leaves = [leaves_of(x), *hx_leaves]
    g_r = torch.autograd.grad(sum((t * w).sum() for t, w in zip((out_r, h_r, c_r), weights)), leaves + list(ref.parameters()))
    g_o = torch.autograd.grad(sum((t * w).sum() for t, w in zip((out_o, h_o, c_o), weights)), leaves + list(ours.parameters()))
    names = ["input"] + ["h0", "c0"][: len(hx_leaves)] + [n for n, _ in ours.named_parameters()]
    for name, a, b in zip(names, g_o, g_r):
        assert rel_error(a, b) <= TOL[dtype], name


def test_sweep_covers_at_least_200_configurations():
    assert len(COMBOS) * 2 >= 200


@pytest.mark.parametrize("bidirectional", [False, True])
def test_dropout_one_zeroes_inner_layers_like_nn_lstm(bidirectional):
    # p=1 makes dropout deterministic: the next layers see zeros, in both.
    ref, ours = make_pair(torch.float64, input_size=3, hidden_size=4, num_layers=3, dropout=1.0,
                          bidirectional=bidirectional)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    for mode in (True, False):
        ref.train(mode), ours.train(mode)
        out_r, (h_r, c_r) = ref(x)
        out_o, (h_o, c_o) = ours(x)
        torch.testing.assert_close(out_o, out_r)
        torch.testing.assert_close(h_o, h_r)
        torch.testing.assert_close(c_o, c_r)


def test_dropout_train_is_random_eval_is_exact_and_expectation_matches():
    torch.manual_seed(0)
    ref, ours = make_pair(torch.float64, input_size=2, hidden_size=3, num_layers=2, dropout=0.5)
    x = torch.randn(3, 1, 2, dtype=torch.float64)
    ref.eval(), ours.eval()
    torch.testing.assert_close(ours(x)[0], ref(x)[0])
    ours.train(), ref.train()
    a, b = ours(x)[0], ours(x)[0]
    assert not torch.equal(a, b)
    # The last layer gets no dropout: its input is the only random part.
    n = 4000
    mean_o = torch.stack([ours(x)[0] for _ in range(n)]).mean(0)
    mean_r = torch.stack([ref(x)[0] for _ in range(n)]).mean(0)
    assert (mean_o - mean_r).abs().max() < 0.02


def test_double_precision_is_exact_for_long_sequences():
    ref, ours = make_pair(torch.float64, input_size=8, hidden_size=16, num_layers=2, bidirectional=True, proj_size=5)
    x = torch.randn(200, 3, 8, dtype=torch.float64)
    assert rel_error(ours(x)[0], ref(x)[0]) <= 1e-10
