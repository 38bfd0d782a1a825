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


# --- bfloat16 / float16 on the CPU ------------------------------------------------


def _outputs_and_grads(model, x, hx):
    x = x.detach().clone().requires_grad_()
    hx = tuple(t.detach().clone().requires_grad_() for t in hx)
    out, (h, c) = model(x, hx)
    w = [torch.randn(t.shape, generator=torch.Generator().manual_seed(k)) for k, t in enumerate((out, h, c))]
    sum((t.float() * wk).sum() for t, wk in zip((out, h, c), w)).backward()
    return [out, h, c, x.grad, *(t.grad for t in hx), *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kw", [dict(num_layers=2), dict(bidirectional=True, proj_size=3)], ids=["stacked", "bidir_proj"])
def test_reduced_precision_modules_on_cpu_are_as_close_to_fp32_as_nn_lstm(dtype, kw):
    # nn.LSTM computes these in the reduced dtype; pipelstm computes in
    # float32 and rounds the results, so it must be at least as close to
    # the float32 model (nn.LSTM's error, plus a little for rounding noise).
    torch.manual_seed(0)
    ref32, _ = make_pair(torch.float32, input_size=5, hidden_size=6, **kw)
    ref, ours = nn.LSTM(5, 6, **kw).to(dtype), pipelstm.LSTM(5, 6, **kw).to(dtype)
    ref.load_state_dict(ref32.state_dict())
    ours.load_state_dict(ref32.state_dict())
    D, L, P = 2 if ref.bidirectional else 1, ref.num_layers, ref.proj_size or 6
    x, hx = torch.randn(7, 3, 5), (torch.randn(L * D, 3, P), torch.randn(L * D, 3, 6))
    exact = _outputs_and_grads(ref32, x, hx)
    theirs = _outputs_and_grads(ref, x.to(dtype), tuple(t.to(dtype) for t in hx))
    mine = _outputs_and_grads(ours, x.to(dtype), tuple(t.to(dtype) for t in hx))
    for k, (e, t, m) in enumerate(zip(exact, theirs, mine)):
        assert m.dtype == t.dtype == dtype, k
        assert rel_error(m.float(), e) <= max(rel_error(t.float(), e), 1e-2 if dtype == torch.bfloat16 else 2e-3), k


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_reduced_precision_packed_and_cell_on_cpu(dtype):
    torch.manual_seed(0)
    ref32 = nn.LSTM(4, 5)
    ours = pipelstm.LSTM(4, 5).to(dtype)
    ours.load_state_dict(ref32.state_dict())
    seqs = [torch.randn(n, 4) for n in (5, 2, 4)]
    out, (h, _) = ours(pack_sequence([s.to(dtype) for s in seqs], enforce_sorted=False))
    exact, (h32, _) = ref32(pack_sequence(seqs, enforce_sorted=False))
    assert out.data.dtype == dtype and rel_error(out.data.float(), exact.data) <= 1e-2
    assert rel_error(h.float(), h32) <= 1e-2
    cell32 = nn.LSTMCell(4, 5)
    cell = pipelstm.LSTMCell(4, 5).to(dtype)
    cell.load_state_dict(cell32.state_dict())
    hy, cy = cell(seqs[0].to(dtype))
    assert hy.dtype == dtype and rel_error(hy.float(), cell32(seqs[0])[0]) <= 1e-2


def test_mixed_reduced_and_float32_tensors_are_refused():
    m = pipelstm.LSTM(4, 5).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"expected `h0` to have the dtype of `input` \(BFloat16\), got Float"):
        pipelstm.ops.lstm_layer(torch.randn(3, 2, 4, dtype=torch.bfloat16), torch.zeros(2, 5), torch.zeros(2, 5,
                                dtype=torch.bfloat16), m.weight_ih_l0, m.weight_hh_l0)
