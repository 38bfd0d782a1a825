"""Activation recomputation (``Pipeline(checkpoint=...)``) and reproducible dropout.

Recomputing a work item's forward just before its backward runs the same ops
on the same inputs with the same thread budget, and replays the dropout
masks it kept, so results are bitwise those without recomputation; what the
forward keeps for backward shrinks.
"""

import copy

import pytest
import torch
from torch import nn

import pipelstm


def lm_model():
    # units: 0, 1.l0, 1.dropout0, 1.l1, 1.dropout1, 1.l2, 2, 3
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(37, 6), pipelstm.LSTM(6, 16, num_layers=3, dropout=0.3), nn.Dropout(0.25),
                         nn.Linear(16, 5))


def train_step(pipe, x, hx, seed):
    torch.manual_seed(seed)  # the dropout masks
    out, (h, c) = pipe(x, hx)
    (out.square().sum() + h.sum() + c.square().sum()).backward()
    return out, h, c


@pytest.mark.parametrize("balance, K, M", [([8], 1, 1), ([4, 4], 3, 2), ([1, 3, 4], 7, 3), ([2, 6], 2, 1)])
def test_recomputation_is_bitwise_and_keeps_less(balance, K, M):
    base = lm_model()
    T, B = 11, 5
    x = torch.randint(0, 37, (T, B))
    results = {}
    for mode in ("never", "except_last", "always"):
        pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu"] * len(balance), chunks=K, micro_batches=M,
                                 balance=balance, threads=1, checkpoint=mode)
        hx = tuple(torch.randn(3, B, 16, generator=torch.Generator().manual_seed(i)).requires_grad_()
                   for i in range(2))
        out, h, c = train_step(pipe, x, hx, seed=5)  # training mode: dropout on
        results[mode] = (out, h, c, [p.grad for p in pipe.parameters()], [t.grad for t in hx],
                         pipe.saved_activation_bytes)
        if mode == "always" or (mode == "except_last" and K * M > 1):
            assert any(e["phase"] == "recompute" for e in pipe.trace())
    ref = results["never"]
    for mode in ("except_last", "always"):
        got = results[mode]
        for a, b in zip(got[:3], ref[:3]):
            assert torch.equal(a, b), mode
        for a, b in zip(got[3] + got[4], ref[3] + ref[4]):
            assert torch.equal(a, b), mode
    never, last, always = (results[m][5] for m in ("never", "except_last", "always"))
    assert always < never / 3, (always, never)
    assert always <= last <= never
    if K * M > 1:
        assert last < never


def test_distinct_phases_in_the_timeline(tmp_path):
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], balance=[4, 4], chunks=2, micro_batches=2,
                             threads=1, checkpoint="except_last")
    train_step(pipe, torch.randint(0, 37, (6, 4)), None, seed=0)
    spans = [(e["stage"], e["micro_batch"], e["chunk"]) for e in pipe.trace() if e["phase"] == "recompute"]
    # every item but each stage's last forward item (m=1, k=1) is replayed
    assert sorted(spans) == sorted((s, m, k) for s in range(2) for m in range(2) for k in range(2) if (m, k) != (1, 1))
    summary = pipe.timeline(str(tmp_path / "t.json"))
    assert 0 <= summary["backward_bubble"] <= 1


def test_plan_shows_the_smaller_activation_memory():
    plain = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], balance=[4, 4])
    recomputed = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], balance=[4, 4], checkpoint="always")
    for a, b in zip(plain.plan.rows, recomputed.plan.rows):
        assert b["act_bytes"] < a["act_bytes"]
    assert "checkpoint='always'" in repr(recomputed)


def test_bad_checkpoint_mode_is_rejected():
    with pytest.raises(ValueError, match="checkpoint must be one of 'never', 'except_last', 'always'"):
        pipelstm.Pipeline(lm_model(), devices=["cpu"], checkpoint="sometimes")


def test_dropout_is_reproducible_under_manual_seed():
    # Two stages draw masks in parallel threads; the masks depend on the seed
    # and the work item, not on which thread ran first.
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu"] * 3, balance=[2, 3, 3], chunks=3, micro_batches=2,
                             threads=1)
    x = torch.randint(0, 37, (9, 4))
    outs = []
    for _ in range(4):
        torch.manual_seed(123)
        with torch.no_grad():
            outs.append(pipe(x)[0])
    assert all(torch.equal(o, outs[0]) for o in outs)
    with torch.no_grad():
        other = pipe(x)[0]  # the global generator moved on: new masks
    assert not torch.equal(other, outs[0])
