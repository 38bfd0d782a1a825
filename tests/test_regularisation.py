"""pipelstm.LSTM's weight_dropout and dropout_mode="variational"
(python/pipelstm/regularisation.py) against an independent reference: a
plain loop over steps in float64, given the masks pipelstm drew (recorded
by replacing the mask functions), outputs and every gradient; then the
masks themselves: how many are dropped, their scale, one per sequence, the
seed, evaluation mode."""

import itertools

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

import pipelstm
from pipelstm import regularisation

I, H = 3, 5


def ref_layer(x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    """One layer direction over x [T, B, I], step by step."""
    out = [None] * x.size(0)
    for t in (reversed(range(x.size(0))) if reverse else range(x.size(0))):
        gates = x[t] @ w_ih.T + h @ w_hh.T
        if b_ih is not None:
            gates = gates + b_ih + b_hh
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        if w_hr is not None:
            h = h @ w_hr.T
        out[t] = h
    return torch.stack(out), h, c


def ref_stack(lstm, x, h0, c0, weight_masks, sequence_masks):
    """The stack over time-major x [T, B, I] with the given masks: w_hh of
    layer l, direction d times weight_masks[l * D + d]; between layers l
    and l + 1 the output times sequence_masks[l] ([B, F], every step)."""
    D = 2 if lstm.bidirectional else 1
    hs, cs = [], []
    for layer in range(lstm.num_layers):
        outs = []
        for d in range(D):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            get = lambda n: getattr(lstm, n + sfx, None)  # noqa: E731
            w_hh = get("weight_hh") * weight_masks[layer * D + d] if weight_masks else get("weight_hh")
            out, h, c = ref_layer(x, h0[layer * D + d], c0[layer * D + d], get("weight_ih"), w_hh, get("bias_ih"),
                                  get("bias_hh"), get("weight_hr"), d == 1)
            outs.append(out)
            hs.append(h)
            cs.append(c)
        x = torch.cat(outs, dim=-1)
        if layer < lstm.num_layers - 1 and sequence_masks:
            x = x * sequence_masks[layer]
    return x, torch.stack(hs), torch.stack(cs)


@pytest.fixture
def recorded(monkeypatch):
    """The masks pipelstm draws, in the order it draws them (fixed values,
    not torch's generator, so the reference gets the same)."""
    drawn = dict(weight=[], sequence=[])
    gen = torch.Generator().manual_seed(7)

    def weight_mask(w, p, seed=None):
        m = ((torch.rand(w.shape, generator=gen) >= p).to(w.dtype) / (1 - p)).to(w.device)
        drawn["weight"].append(m)
        return m

    def sequence_mask(batch, features, p, like):
        m = ((torch.rand(batch, features, generator=gen) >= p).to(like.dtype) / (1 - p)).to(like.device)
        drawn["sequence"].append(m)
        return m

    monkeypatch.setattr(regularisation, "weight_mask", weight_mask)
    monkeypatch.setattr(regularisation, "sequence_mask", sequence_mask)
    return drawn


CONFIGS = list(itertools.product((1, 2), (False, True), (0, 2), (False, True)))
OPTIONS = [dict(weight_dropout=0.4), dict(dropout=0.3, dropout_mode="variational"),
           dict(weight_dropout=0.25, dropout=0.5, dropout_mode="variational")]


@pytest.mark.parametrize("option", OPTIONS, ids=["weight", "variational", "both"])
@pytest.mark.parametrize("layers, bidirectional, proj, batch_first", CONFIGS,
                         ids=lambda v: str(v))
def test_matches_the_reference_with_the_same_masks(recorded, option, layers, bidirectional, proj, batch_first):
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(I, H, num_layers=layers, bidirectional=bidirectional, proj_size=proj,
                         batch_first=batch_first, **option).double()
    D, P = (2 if bidirectional else 1), proj or H
    T, B = 6, 3
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * D, B, P, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(layers * D, B, H, dtype=torch.float64, requires_grad=True)
    out, (h, c) = lstm(x.transpose(0, 1) if batch_first else x, (h0, c0))
    out = out.transpose(0, 1) if batch_first else out
    want = ref_stack(lstm, x, h0, c0, recorded["weight"], recorded["sequence"])
    assert len(recorded["weight"]) == (layers * D if option.get("weight_dropout") else 0)
    assert len(recorded["sequence"]) == (layers - 1 if option.get("dropout_mode") else 0)
    leaves = [x, h0, c0, *lstm.parameters()]
    weights = [torch.randn_like(t) for t in want]
    got_grads = torch.autograd.grad(sum((a * w).sum() for a, w in zip((out, h, c), weights)), leaves)
    want_grads = torch.autograd.grad(sum((a * w).sum() for a, w in zip(want, weights)), leaves)
    for a, b in zip((out, h, c, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("option", OPTIONS, ids=["weight", "variational", "both"])
def test_packed_input_gets_one_mask_per_sequence(recorded, option):
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(I, H, num_layers=2, bidirectional=True, **option).double()
    lengths = [6, 4, 1]
    seqs = [torch.randn(n, I, dtype=torch.float64) for n in lengths]
    out, (h, c) = lstm(pack_sequence(seqs))
    padded, _ = pad_packed_sequence(out)
    weight, sequence = recorded["weight"], recorded["sequence"]
    for b, s in enumerate(seqs):  # each sequence alone, with its own row of each mask
        z = torch.zeros(4, 1, H, dtype=torch.float64)
        want, want_h, want_c = ref_stack(lstm, s[:, None], z, z, weight, [m[b:b + 1] for m in sequence])
        torch.testing.assert_close(padded[:len(s), b], want[:, 0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(h[:, b], want_h[:, 0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(c[:, b], want_c[:, 0], rtol=1e-10, atol=1e-10)


def test_the_masks_drop_p_and_scale_the_rest():
    torch.manual_seed(0)
    w = torch.ones(400, 500)
    m = regularisation.weight_mask(w, 0.3)
    assert m.unique().tolist() == pytest.approx([0.0, 1 / 0.7])
    assert abs((m == 0).float().mean().item() - 0.3) < 0.01
    s = regularisation.sequence_mask(300, 400, 0.6, w)
    assert s.shape == (300, 400) and abs((s == 0).float().mean().item() - 0.6) < 0.01
    assert s.unique().tolist() == pytest.approx([0.0, 1 / 0.4])


def test_a_seeded_weight_mask_is_its_seeds_alone():
    # A pipeline's masks: from the pass seed and the unit's place, not from
    # torch's generator, so stages in other processes draw them alike.
    w = torch.ones(300, 400)
    seeds = [regularisation.unit_seed(12345, u) for u in range(4)]
    assert len(set(seeds)) == 4 and all(0 <= s < 2**62 for s in seeds)
    assert regularisation.unit_seed(None, 0) is None
    state = torch.get_rng_state()
    a, b = (regularisation.weight_mask(w, 0.3, seeds[1]) for _ in range(2))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b) and not torch.equal(a, regularisation.weight_mask(w, 0.3, seeds[2]))
    assert abs((a == 0).float().mean().item() - 0.3) < 0.01 and a.unique().tolist() == pytest.approx([0.0, 1 / 0.7])


def test_variational_dropout_is_the_same_at_every_step():
    torch.manual_seed(0)
    r = regularisation.Regularisation(dropout_mode="variational")
    y = r.between_layers(torch.ones(7, 4, 50), 0.5, True)
    assert torch.equal(y, y[:1].expand_as(y))  # one mask per sequence, every step
    assert 0 < (y[0] == 0).float().mean() < 1
    e = regularisation.Regularisation().between_layers(torch.ones(7, 4, 50), 0.5, True)
    assert not torch.equal(e, e[:1].expand_as(e))  # nn.LSTM's: per element


def test_one_weight_mask_per_call_and_the_seed_reproduces_it():
    def run():
        torch.manual_seed(3)
        lstm = pipelstm.LSTM(I, H, num_layers=2, weight_dropout=0.5, dropout=0.5, dropout_mode="variational")
        x = torch.randn(6, 2, I)
        return lstm(x)[0], lstm(x)[0]

    (a1, a2), (b1, b2) = run(), run()
    assert torch.equal(a1, b1) and torch.equal(a2, b2)  # the same seed, the same run
    assert not torch.equal(a1, a2)  # new masks each call


def test_evaluation_is_nn_lstm():
    torch.manual_seed(0)
    ours = pipelstm.LSTM(I, H, num_layers=2, dropout=0.5, weight_dropout=0.5, dropout_mode="variational").eval()
    ref = nn.LSTM(I, H, num_layers=2, dropout=0.5).eval()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(6, 2, I)
    torch.testing.assert_close(ours(x)[0], ref(x)[0])
    torch.testing.assert_close(ours(x)[0], ours(x)[0], rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(weight_dropout=1.0), r"weight_dropout must be a probability in \[0, 1\), got 1\.0"),
    (dict(weight_dropout=-0.1), r"weight_dropout must be a probability"),
    (dict(weight_dropout="0.1"), r"weight_dropout must be a probability in \[0, 1\), got '0\.1'"),
    (dict(dropout_mode="locked"), r"dropout_mode must be one of 'element', 'variational', got 'locked'"),
])
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pipelstm.LSTM(I, H, **kwargs)


def test_state_dict_and_repr():
    lstm = pipelstm.LSTM(I, H, num_layers=2, dropout=0.2, weight_dropout=0.3, dropout_mode="variational")
    ref = nn.LSTM(I, H, num_layers=2, dropout=0.2)
    ref.load_state_dict(lstm.state_dict())  # the parameters are nn.LSTM's
    assert repr(lstm) == "LSTM(3, 5, num_layers=2, dropout=0.2, weight_dropout=0.3, dropout_mode='variational')"


def test_compiles_fullgraph():
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(I, H, num_layers=2, dropout=0.5, weight_dropout=0.3, dropout_mode="variational")
    x = torch.randn(6, 2, I)
    out, _ = torch.compile(lstm, fullgraph=True)(x)
    out.sum().backward()
    assert lstm.weight_hh_l0.grad is not None and out.shape == (6, 2, H)


def _weight_dropped_pair(**pipeline):
    """(pipelined, plain) pipelstm.LSTM with weight_dropout and the same weights."""
    torch.manual_seed(0)
    plain = pipelstm.LSTM(I, H, num_layers=2, weight_dropout=0.4)
    piped = pipelstm.LSTM(I, H, num_layers=2, weight_dropout=0.4, **pipeline)
    piped.load_state_dict(plain.state_dict())
    return piped, plain


@pytest.mark.parametrize("chunks, micro_batches", [(1, 1), (3, 2)])
def test_weight_dropout_through_the_pipeline_is_the_modules(recorded, chunks, micro_batches):
    # LSTM(devices=) draws one mask per layer and pass, as the module draws
    # one per layer and call: with the same masks, the same results.
    piped, plain = _weight_dropped_pair(devices=["cpu", "cpu"], chunks=chunks, micro_batches=micro_batches)
    x = torch.randn(6, 4, I)
    out, (h, c) = piped(x)
    masks = list(recorded["weight"])
    assert len(masks) == 2  # one per layer, for the whole pass
    recorded["weight"].clear()
    with pytest.MonkeyPatch.context() as m:
        replay = iter(masks)
        m.setattr(regularisation, "weight_mask", lambda w, p, seed=None: next(replay))
        want, (want_h, want_c) = plain(x)
    grads = torch.autograd.grad(out.sum() + h.sum(), list(piped.parameters()))
    want_grads = torch.autograd.grad(want.sum() + want_h.sum(), list(plain.parameters()))
    for a, b in zip((out, h, c, *grads), (want, want_h, want_c, *want_grads)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
