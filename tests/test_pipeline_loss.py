"""Pipeline(loss_fn=nn.CrossEntropyLoss(...)): the loss computed inside the
last stage, item by item, equals F.cross_entropy over the unsplit model's
logits (the mean is a sum of per-item sums over the counted tokens, a
different summation order: within 1e-6; bitwise with one piece)."""

import copy

import pytest
import torch
from torch import nn

import pipelstm

from reference import rel_error

TOL = 1e-6
V = 37


def lm_model(batch_first=False):
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(V, 6), pipelstm.LSTM(6, 16, num_layers=2, batch_first=batch_first),
                         nn.Linear(16, V))


def unsplit_loss(model, x, y, loss_fn, hx=None):
    h = model[0](x)
    h, (h_n, c_n) = model[1](h, hx)
    logits = model[2](h)
    return loss_fn(logits.reshape(-1, V), y.reshape(-1)), h_n, c_n


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("balance, K, M, checkpoint", [
    ([4], 1, 1, "never"), ([1, 3], 3, 2, "never"), ([3, 1], 11, 5, "always"), ([1, 2, 1], 4, 3, "except_last"),
])
def test_loss_matches_unsplit(balance, K, M, checkpoint, reduction):
    base = lm_model()
    x, y = torch.randint(0, V, (11, 5)), torch.randint(0, V, (11, 5))
    y[0, :2] = y[7, 4] = 3  # ignored targets
    hx = (torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    ref = copy.deepcopy(base)
    loss_r, h_r, c_r = unsplit_loss(ref, x, y, nn.CrossEntropyLoss(ignore_index=3, reduction=reduction), hx)
    (loss_r + h_r.sum()).backward()
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu"] * len(balance), balance=balance, chunks=K,
                             micro_batches=M, threads=1, checkpoint=checkpoint,
                             loss_fn=nn.CrossEntropyLoss(ignore_index=3, reduction=reduction))
    loss, (h_n, _) = pipe(x, hx, target=y)
    (loss + h_n.sum()).backward()
    assert loss.dim() == 0
    if K == M == 1:
        assert torch.equal(loss, loss_r)
    assert rel_error(loss, loss_r) <= TOL
    for (name, a), b in zip(pipe.named_parameters(), ref.parameters()):
        assert rel_error(a.grad, b.grad) <= TOL, name


def test_batch_first_targets_and_no_grad():
    base = lm_model(batch_first=True)
    x, y = torch.randint(0, V, (4, 9)), torch.randint(0, V, (4, 9))
    loss_r, _, _ = unsplit_loss(base, x, y, nn.CrossEntropyLoss())
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu", "cpu"], chunks=3, micro_batches=2, threads=1,
                             loss_fn=nn.CrossEntropyLoss())
    with torch.no_grad():
        loss, _ = pipe(x, target=y)
    assert rel_error(loss, loss_r.detach()) <= TOL


def test_the_loss_runs_inside_the_last_stage():
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], balance=[3, 1], chunks=3, threads=1,
                             loss_fn=nn.CrossEntropyLoss())
    assert [u.name for s in pipe.core.stage_specs() for u in s.units] == ["0", "1.l0", "1.l1", "2", "loss"]
    loss, _ = pipe(torch.randint(0, V, (6, 2)), target=torch.randint(0, V, (6, 2)))
    loss.backward()
    assert pipe.state_dict().keys() == lm_model().state_dict().keys()


@pytest.mark.parametrize("loss_fn, message", [
    (nn.MSELoss(), "must be an nn.CrossEntropyLoss"),
    (nn.CrossEntropyLoss(label_smoothing=0.1), "label_smoothing"),
    (nn.CrossEntropyLoss(weight=torch.ones(V)), "class weights"),
    (nn.CrossEntropyLoss(reduction="none"), "reduction='none'"),
])
def test_unsupported_losses_are_rejected(loss_fn, message):
    with pytest.raises(ValueError, match=message):
        pipelstm.Pipeline(lm_model(), devices=["cpu"], loss_fn=loss_fn)


def test_bad_targets_are_rejected_before_any_work():
    pipe = pipelstm.Pipeline(lm_model(), devices=["cpu", "cpu"], threads=1, loss_fn=nn.CrossEntropyLoss())
    x = torch.randint(0, V, (6, 2))
    with pytest.raises(ValueError, match="target="):
        pipe(x)
    with pytest.raises(ValueError, match="torch.int64"):
        pipe(x, target=torch.zeros(6, 2))
    with pytest.raises(RuntimeError, match=r"expected target of shape \[6, 2\]"):
        pipe(x, target=torch.zeros(6, 3, dtype=torch.long))
    plain = pipelstm.Pipeline(lm_model(), devices=["cpu"], threads=1)
    with pytest.raises(ValueError, match="target="):
        plain(x, target=torch.zeros(6, 2, dtype=torch.long))
