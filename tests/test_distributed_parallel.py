"""pipelstm/distributed/parallel.py in one process (a gloo group of one):
what PipelineParallel's steps do with the loss they are given. Two or more
processes are tests/test_distributed.py's."""

import pytest
import torch
from torch import nn

import pipelstm
import pipelstm.distributed as pdist
from distributed_utils import needs_gloo

pytestmark = needs_gloo

V = 10


@pytest.mark.parametrize("where", ["train_step", "eval_step"])
def test_a_cross_entropy_module_given_to_a_step_is_per_token(mesh, where):
    # train_step(x, y, nn.CrossEntropyLoss()) on a [T, B, V] output: the
    # same loss and gradients as the loss given at construction.
    def pipe_with(**kw):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(V, 8), pipelstm.LSTM(8, 16), nn.Linear(16, V))
        return pdist.PipelineParallel(model, mesh, chunks=2, threads=1, carry_state=False, **kw)

    x, y = torch.randint(0, V, (6, 4)), torch.randint(0, V, (6, 4))
    inside, given = pipe_with(loss_fn=nn.CrossEntropyLoss()), pipe_with()
    want = getattr(inside, where)(x, y)
    got = getattr(given, where)(x, y, nn.CrossEntropyLoss())
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    for a, b in zip(given.parameters(), inside.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)
