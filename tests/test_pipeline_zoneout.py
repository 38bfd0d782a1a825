"""Zoneout in pipelines: a pipelstm.LSTM or LayerNormLSTM with zoneout in a
Pipeline (or with devices=) runs each layer unit with the zoneout op over
its time chunks, with masks each (micro-batch, chunk) item draws from the
pass's seed. Given those masks (read back through the engine's own
zoneout_masks and the pass seed torch.manual_seed governs), the output,
h_n, c_n and every gradient equal a step-by-step float64 reference run on
each sequence alone, dense and packed, with recomputation (which must
replay the same masks); in evaluation the pipeline is the module."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from pipelstm import _C
from pipelstm.pipeline.units import flatten

from reference import layer
from test_layernorm_lstm import direction_weights, reference_direction

_engine = _C.pipeline
TOL = dict(rtol=1e-10, atol=1e-10)
V, E, H, L = 19, 6, 8, 2
ZONEOUT = (0.4, 0.3)
SEED = 7
LENGTHS = [9, 2, 7, 1, 9, 3]  # with K = 6 the short micro-batches have items without rows


def _model(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    if kind == "lstm":
        lstm = pipelstm.LSTM(E, H, L, zoneout=ZONEOUT)
    else:
        lstm = pipelstm.LayerNormLSTM(E, H, L, eps=1e-4, zoneout=ZONEOUT)
    model = nn.Sequential(nn.Embedding(V, E), lstm, nn.Linear(H, V)).double()
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that a missing norm shows
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5) if "weight" in name else p.uniform_(-0.5, 0.5)
    return model


def _item_masks(pass_seed, first_unit, lengths, K, M, packed=False):
    """The keep masks the pass drew, per layer, as padded [T, B, H] tensors
    over the sequences in decreasing length (a micro-batch's items hold its
    running sequences, time-major; a packed batch's chunks are cut by tokens)."""
    T, B = max(lengths), len(lengths)
    if packed:
        batch_sizes = torch.tensor([sum(n > t for n in lengths) for t in range(T)])
        _, _, t_sizes, b_sizes = _engine.packed_item_grid(batch_sizes, K, M)
    else:
        _, _, t_sizes, b_sizes = _engine.item_grid(T, B, K, M)
    like = torch.empty(0, dtype=torch.float64)
    masks = []
    for l in range(L):
        keep_c, keep_h = torch.zeros(T, B, H, dtype=torch.float64), torch.zeros(T, B, H, dtype=torch.float64)
        b0 = 0
        for m, bm in enumerate(b_sizes):
            t0 = 0
            for k, tk in enumerate(t_sizes):
                cells = [(t, b) for t in range(t0, t0 + tk) for b in range(b0, b0 + bm) if lengths[b] > t]
                if cells:
                    c, h = _engine.zoneout_masks(pass_seed, first_unit + l, m, k, len(cells), H, *ZONEOUT, like)
                    for row, (t, b) in enumerate(cells):
                        keep_c[t, b], keep_h[t, b] = c[row], h[row]
                t0 += tk
            b0 += bm
        masks.append((keep_c, keep_h))
    return masks


def _reference(kind, lstm, x, lengths, h0, c0, masks):
    """Each sequence alone through the layers with its masks: (outputs per
    sequence [L_b, H], h_n, c_n); x [T, B, E] over sorted sequences."""
    outs, hs, cs = [], [[] for _ in range(L)], [[] for _ in range(L)]
    for b, n in enumerate(lengths):
        seq = x[:n, b]
        for l in range(L):
            keep_c, keep_h = (t[:n, b] for t in masks[l])
            if kind == "lstm":
                w = [getattr(lstm, f"{name}_l{l}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
                out, h, c = layer(seq.unsqueeze(1), h0[l, b:b + 1], c0[l, b:b + 1], *w,
                                  keep_c=keep_c.unsqueeze(1), keep_h=keep_h.unsqueeze(1))
                seq, h, c = out[:, 0], h[0], c[0]
            else:
                seq, h, c = reference_direction(seq, h0[l, b], c0[l, b], direction_weights(lstm, l, False),
                                                keep_c, keep_h, eps=lstm.eps)
            hs[l].append(h)
            cs[l].append(c)
        outs.append(seq)
    return outs, torch.stack([torch.stack(r) for r in hs]), torch.stack([torch.stack(r) for r in cs])


def _check(kind, model, pipe, x, lengths, K, M, first_unit=1):
    """``x``: [T, B] tokens (every sequence of length T) or a PackedSequence of them."""
    B = len(lengths)
    order = torch.arange(B) if isinstance(x, torch.Tensor) else x.sorted_indices
    sorted_lengths = [lengths[i] for i in order]
    torch.manual_seed(SEED)
    masks = _item_masks(_engine.draw_pass_seed(), first_unit, sorted_lengths, K, M,
                        packed=not isinstance(x, torch.Tensor))
    g = torch.Generator().manual_seed(3)
    hx = (torch.randn(L, B, H, dtype=torch.float64, generator=g),
          torch.randn(L, B, H, dtype=torch.float64, generator=g))

    h = tuple(t.clone().requires_grad_() for t in hx)
    torch.manual_seed(SEED)
    out, (h_n, c_n) = pipe(x, h)
    data = out if isinstance(out, torch.Tensor) else out.data
    (data.sin().sum() + h_n.cos().sum() + c_n.square().sum()).backward()
    got = (data, h_n, c_n, h[0].grad, h[1].grad)

    emb, lstm, dec = model
    tokens = x if isinstance(x, torch.Tensor) else torch.nn.utils.rnn.pad_packed_sequence(x)[0]
    r = tuple(t.clone().requires_grad_() for t in hx)
    seqs, rh_n, rc_n = _reference(kind, lstm, emb(tokens[:, order]), sorted_lengths, r[0][:, order],
                                  r[1][:, order], masks)
    logits = [dec(s) for s in seqs]
    inverse = torch.argsort(order)
    rh_n, rc_n = rh_n[:, inverse], rc_n[:, inverse]
    if isinstance(x, torch.Tensor):
        want_out = torch.stack(logits, 1)[:, inverse]
    else:  # packed rows: step t holds the sorted sequences still running
        want_out = torch.cat([torch.stack([s[t] for s in logits if s.shape[0] > t]) for t in range(max(lengths))])
    (want_out.sin().sum() + rh_n.cos().sum() + rc_n.square().sum()).backward()
    want = (want_out, rh_n, rc_n, r[0].grad, r[1].grad)
    for name, a, b in zip(("output", "h_n", "c_n", "grad h0", "grad c0"), got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")
    for (name, pa), (_, pb) in zip(pipe.named_parameters(), model.named_parameters()):
        assert pa.grad is not None and pb.grad is not None, name
        torch.testing.assert_close(pa.grad, pb.grad, **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kind", ["lstm", "layernorm"])
def test_each_layer_unit_carries_the_probabilities(kind):
    units = flatten(_model(kind).named_children())
    lstm = units[1:1 + L]
    assert all(u.options["zoneout_c"] == ZONEOUT[0] and u.options["zoneout_h"] == ZONEOUT[1] for u in lstm)
    assert all(u.spec(0) is not None for u in lstm)  # the engine takes the options
    plain = flatten(nn.Sequential(pipelstm.LSTM(E, H, L)).named_children())
    assert all("zoneout_c" not in u.options for u in plain)


# units: 0 (Embedding), 1.l0, 1.l1, 2 (Linear)
@pytest.mark.parametrize("balance, K, M, checkpoint", [
    ([2, 2], 1, 1, "never"), ([1, 3], 3, 2, "always"), ([3, 1], 4, 3, "except_last"),
])
@pytest.mark.parametrize("kind", ["lstm", "layernorm"])
def test_training_pass_matches_the_reference_with_its_masks(kind, balance, K, M, checkpoint):
    model = _model(kind)
    pipe = pipelstm.Pipeline(copy.deepcopy(model), ["cpu", "cpu"], chunks=K, micro_batches=M, balance=balance,
                             checkpoint=checkpoint)
    x = torch.randint(0, V, (9, 6), generator=torch.Generator().manual_seed(1))
    _check(kind, model, pipe, x, [9] * 6, K, M)


@pytest.mark.parametrize("K, M, checkpoint", [(1, 1, "never"), (3, 2, "always"), (6, 3, "never")])
@pytest.mark.parametrize("kind", ["lstm", "layernorm"])
def test_packed_training_pass_matches_the_reference_with_its_masks(kind, K, M, checkpoint):
    model = _model(kind)
    pipe = pipelstm.Pipeline(copy.deepcopy(model), ["cpu", "cpu"], chunks=K, micro_batches=M, balance=[2, 2],
                             checkpoint=checkpoint)
    g = torch.Generator().manual_seed(1)
    seq = pack_sequence([torch.randint(0, V, (n,), generator=g) for n in LENGTHS], enforce_sorted=False)
    _check(kind, model, pipe, seq, LENGTHS, K, M)


@pytest.mark.parametrize("kind", ["lstm", "layernorm"])
def test_evaluation_is_the_modules_expected_blend(kind):
    model = _model(kind).eval()
    pipe = pipelstm.Pipeline(copy.deepcopy(model), ["cpu", "cpu"], chunks=3, micro_batches=2).eval()
    x = torch.randint(0, V, (9, 6), generator=torch.Generator().manual_seed(1))
    emb, lstm, dec = model
    out, (h_n, c_n) = lstm(emb(x))
    got, (got_h, got_c) = pipe(x)
    for name, a, b in (("output", got, dec(out)), ("h_n", got_h, h_n), ("c_n", got_c, c_n)):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


def test_lstm_with_devices_runs_zoneout():
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(E, H, L, zoneout=ZONEOUT, devices=["cpu", "cpu"], chunks=3, micro_batches=2).double()
    plain = pipelstm.LSTM(E, H, L, zoneout=ZONEOUT).double()
    plain.load_state_dict(lstm.state_dict())
    x = torch.randn(9, 6, E, dtype=torch.float64)
    torch.manual_seed(SEED)
    masks = _item_masks(_engine.draw_pass_seed(), 0, [9] * 6, 3, 2)
    torch.manual_seed(SEED)
    out, (h_n, c_n) = lstm(x)
    zeros = torch.zeros(L, 6, H, dtype=torch.float64)
    seqs, want_h, want_c = _reference("lstm", plain, x, [9] * 6, zeros, zeros, masks)
    torch.testing.assert_close(out, torch.stack(seqs, 1), **TOL)
    torch.testing.assert_close((h_n, c_n), (want_h, want_c), **TOL)


def test_masks_keep_with_their_probabilities_and_differ_by_item():
    like = torch.empty(0)
    c, h = _engine.zoneout_masks(123, 1, 0, 0, 4000, 64, 0.25, 0.75, like)
    assert c.shape == h.shape == (4000, 64) and c.dtype == torch.float32
    assert set(c.unique().tolist()) == {0.0, 1.0} and set(h.unique().tolist()) == {0.0, 1.0}
    assert abs(c.mean().item() - 0.25) < 0.01 and abs(h.mean().item() - 0.75) < 0.01
    again, _ = _engine.zoneout_masks(123, 1, 0, 0, 4000, 64, 0.25, 0.75, like)
    assert torch.equal(c, again)  # a pass is reproducible
    for other in [(124, 1, 0, 0), (123, 2, 0, 0), (123, 1, 1, 0), (123, 1, 0, 1)]:
        assert not torch.equal(c, _engine.zoneout_masks(*other, 4000, 64, 0.25, 0.75, like)[0]), other
