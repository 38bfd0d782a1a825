"""PipelineParallel with PackedSequence input: two stages in processes of
their own over gloo (pipelstm.bench.groups.Group), every rank given the same
PackedSequence; one training step's loss and every parameter's gradient equal
the unsplit model's on the same packed batch (to 1e-6, fp32), with the loss
inside the last stage or outside it, and with micro-batches whose sequences
end before the late chunks (items without rows, nothing sent for them but
empty pieces)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from pipelstm.bench.groups import Group

from distributed_utils import needs_gloo

pytestmark = needs_gloo

V, E, H = 19, 6, 8
LENGTHS = [9, 2, 7, 1, 9, 3, 5]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(V, E), pipelstm.LSTM(E, H, num_layers=2), nn.Linear(H, V))


def _batch():
    g = torch.Generator().manual_seed(3)
    x = pack_sequence([torch.randint(0, V, (n,), generator=g) for n in LENGTHS], enforce_sorted=False)
    y = pack_sequence([torch.randint(0, V, (n,), generator=g) for n in LENGTHS], enforce_sorted=False)
    return x, y


def _outside_loss(out, target):
    return F.cross_entropy(out.data, target.data)


class _PackedStep:
    """This rank's stage of a 2-stage PipelineParallel and one packed training step."""

    def __init__(self, chunks: int, micro_batches: int, loss_inside: bool) -> None:
        from pipelstm import distributed as pdist

        mesh = pdist.init_mesh(pp=2, timeout=120)
        self.pipe = pdist.PipelineParallel(_model(), mesh, chunks=chunks, micro_batches=micro_batches,
                                           carry_state=False, threads=1,
                                           loss_fn=nn.CrossEntropyLoss() if loss_inside else None)
        self.loss_fn = None if loss_inside else _outside_loss
        self.x, self.y = _batch()
        self.loss = None

    def step(self) -> None:
        self.pipe.zero_grad(set_to_none=True)
        self.loss = self.pipe.train_step(self.x, self.y, self.loss_fn)

    def info(self) -> dict:
        return dict(loss=float(self.loss), grads={n: p.grad.clone() for n, p in self.pipe.named_stage_parameters()})


def setup_packed_step(rank: int, world: int, **kwargs) -> _PackedStep:
    return _PackedStep(**kwargs)


@pytest.mark.parametrize("chunks, micro_batches, loss_inside", [(3, 2, True), (20, 7, False)])
def test_packed_pipeline_parallel_matches_unsplit(chunks, micro_batches, loss_inside):
    model = _model()
    x, y = _batch()
    h, _ = model[1](x._replace(data=model[0](x.data)))
    loss = F.cross_entropy(model[2](h.data), y.data)
    loss.backward()
    with Group("packed pp=2", 2, setup_packed_step, timeout=300, chunks=chunks, micro_batches=micro_batches,
               loss_inside=loss_inside) as g:
        g.step()
        ranks = g.last
    expected = dict(model.named_parameters())
    seen = set()
    for r in ranks:
        assert r["loss"] == pytest.approx(loss.item(), rel=1e-6, abs=1e-6)
        for name, grad in r["grads"].items():
            torch.testing.assert_close(grad, expected[name].grad, rtol=1e-6, atol=1e-6)
            seen.add(name)
    assert seen == set(expected)
