"""pipelstm.LockedDropout (one mask per sequence) on its own, and variational
dropout in pipelines: LockedDropout units and pipelstm.LSTM(dropout_mode=
"variational") between layers keep each sequence's mask across every step,
chunk and micro-batch split, and a pipelined pass equals the unsplit model
(plain-torch layers) run with the masks it drew, outputs and every gradient."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm

from pipeline_masks import pipeline_masks, run_masked
from reference import rel_error


@pytest.mark.parametrize("batch_first", [False, True])
def test_one_mask_per_sequence_at_every_step(batch_first):
    torch.manual_seed(0)
    drop = pipelstm.LockedDropout(0.3, batch_first=batch_first)
    x = torch.ones(4, 9, 200) if batch_first else torch.ones(9, 4, 200)
    y = drop(x)
    steps = y.unbind(1 if batch_first else 0)
    assert all(torch.equal(s, steps[0]) for s in steps)  # the same at every step
    kept = y[y != 0]
    assert kept.numel() < y.numel() and torch.allclose(kept, torch.full_like(kept, 1 / 0.7))
    assert abs((steps[0] == 0).double().mean().item() - 0.3) < 0.05
    assert not torch.equal(steps[0][0], steps[0][1])  # each sequence its own
    assert torch.equal(drop.eval()(x), x)


def test_a_packed_sequence_keeps_its_mask_at_each_of_its_steps():
    torch.manual_seed(1)
    seqs = [torch.ones(n, 50) for n in (5, 3, 3, 1)]
    out = pipelstm.LockedDropout(0.5)(pack_sequence(seqs))
    offsets = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), out.batch_sizes[:-1]]), 0)
    for b, n in enumerate(len(s) for s in seqs):
        rows = out.data[offsets[:n] + b]
        assert torch.equal(rows, rows[:1].expand_as(rows))


@pytest.mark.parametrize("p, match", [(1.0, r"p must be a probability in \[0, 1\), got 1\.0"),
                                      ("0.5", r"got '0\.5'")])
def test_bad_p_is_named(p, match):
    with pytest.raises(ValueError, match=match):
        pipelstm.LockedDropout(p)


def _variational_model():
    # units: 0, 1, 2.l0, 2.dropout0 (variational), 2.l1, 3, 4
    return nn.Sequential(nn.Embedding(37, 6), pipelstm.LockedDropout(0.4),
                         pipelstm.LSTM(6, 8, num_layers=2, dropout=0.3, dropout_mode="variational"),
                         pipelstm.LockedDropout(0.25), nn.Linear(8, 5)).double()


@pytest.mark.parametrize("balance, K, M", [([7], 1, 1), ([3, 4], 3, 2), ([2, 2, 3], 4, 3)])
def test_pipelined_variational_dropout_is_the_unsplit_model_with_its_masks(balance, K, M):
    torch.manual_seed(1)
    base = _variational_model()
    ref = copy.deepcopy(base)
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu"] * len(balance), chunks=K, micro_batches=M,
                             balance=balance, threads=1)
    assert sum(u.kind == "variational_dropout" for u in pipe.core.units) == 3
    T, B = 11, 5
    x = torch.randint(0, 37, (T, B))
    hx = (torch.randn(2, B, 8, dtype=torch.float64), torch.randn(2, B, 8, dtype=torch.float64))
    masks = pipeline_masks(pipe.core, x, seed=11)
    for name, m in masks.items():  # per sequence: the same at every step, in every chunk
        assert torch.equal(m, m[:1].expand_as(m)), name
        assert 0.05 < (m[0] == 0).double().mean() < 0.7, name

    leaves_p = [t.clone().requires_grad_() for t in hx]
    leaves_r = [t.clone().requires_grad_() for t in hx]
    torch.manual_seed(11)
    out_p, (h_p, c_p) = pipe(x, tuple(leaves_p))
    out_r, (h_r, c_r) = run_masked(ref, x, tuple(leaves_r), masks)
    for what, a, b in (("output", out_p, out_r), ("h_n", h_p, h_r), ("c_n", c_p, c_r)):
        assert rel_error(a, b) <= 1e-12, what
    g = [torch.randn(t.shape, dtype=t.dtype) for t in (out_r, h_r, c_r)]
    sum((t * gt).sum() for t, gt in zip((out_p, h_p, c_p), g)).backward()
    sum((t * gt).sum() for t, gt in zip((out_r, h_r, c_r), g)).backward()
    got = [p.grad for p in pipe.parameters()] + [t.grad for t in leaves_p]
    expected = [p.grad for p in ref.parameters()] + [t.grad for t in leaves_r]
    for a, b in zip(got, expected):
        assert rel_error(a, b) <= 1e-12


def test_lstm_with_devices_runs_variational_dropout_between_its_layers():
    torch.manual_seed(2)
    lstm = pipelstm.LSTM(4, 6, num_layers=3, dropout=0.5, dropout_mode="variational", devices=["cpu", "cpu"],
                         chunks=3, micro_batches=2)
    assert [u.kind for u in lstm._pipeline.core.units].count("variational_dropout") == 2
    out, _ = lstm(torch.randn(9, 4, 4))
    out.sum().backward()
    assert all(p.grad is not None for p in lstm.parameters())


def test_a_pipeline_refuses_a_batch_first_locked_dropout_by_name():
    model = nn.Sequential(pipelstm.LockedDropout(0.2, batch_first=True), nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"module '0' is a LockedDropout with batch_first=True"):
        pipelstm.Pipeline(model, devices=["cpu"])
