"""Parameter gradients run once per unit at the end of a stage's backward
("W" after all "B" items), and a stage that is done helps the others on the
same CPU.

What is checked here beyond the exactness tests of test_pipeline.py: with one
micro-batch an LSTM layer's weight gradients are one GEMM over the whole
sequence, so given the same output gradient they are bitwise the unsplit
layer's whatever the number of chunks; the
lighter stage of an unbalanced split runs some of the heavier stage's
tasks; the parameter gradients of a unit that nothing reached stay None.
"""

import copy

import torch
from torch import nn

import pipelstm

from reference import num_threads


def deep_lstm_model():
    torch.manual_seed(0)
    return nn.Sequential(pipelstm.LSTM(32, 128, num_layers=4), nn.Linear(128, 8))


def grads(pipe, x, seed=0):
    pipe.zero_grad(set_to_none=True)
    out, (h, c) = pipe(x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    ((out * g).sum() + h.sum()).backward()
    return [p.grad for p in pipe.parameters()]


def test_lstm_weight_gradients_do_not_depend_on_the_chunks():
    # One layer fed the same output gradient: every step's GEMMs have the
    # same shapes chunked or not, and the weight GEMMs run over all T*B rows
    # in both, so the weight gradients are bitwise the unsplit layer's.
    torch.manual_seed(0)
    base = nn.Sequential(pipelstm.LSTM(32, 128, proj_size=48))
    x = torch.randn(24, 6, 32)
    ref = copy.deepcopy(base)
    with torch.no_grad():
        g = torch.randn(24, 6, 48)
    with num_threads(1):
        out, _ = ref[0](x)
        (out * g).sum().backward()
    for K in (2, 5, 24):
        pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu"], chunks=K, threads=1)
        out, _ = pipe(x)
        (out * g).sum().backward()
        for (name, a), b in zip(pipe.named_parameters(), ref.parameters()):
            assert torch.equal(a.grad, b.grad), (K, name)


def test_a_lighter_stage_takes_over_parameter_gradients():
    base = deep_lstm_model()
    pipe = pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu", "cpu"], balance=[4, 1], chunks=4, threads=1)
    # 128 steps x 16 sequences: each layer's weight GEMMs take tens of ms, far
    # longer than it takes the idle stage's thread to wake up, even on a busy
    # machine (with 32 x 8 it lost the race under load, 1 run in 10)
    x = torch.randn(128, 16, 32)
    grads(pipe, x)
    spans = [e for e in pipe.trace() if e["phase"] == "weights"]
    assert len(spans) == 5  # one per unit with parameters
    per_stage = [sum(e["stage"] == s for e in spans) for s in range(2)]
    assert per_stage[1] >= 2, per_stage  # its own decoder and at least one of stage 0's layers
    # and the result is the one-stage result
    ref = grads(pipelstm.Pipeline(copy.deepcopy(base), devices=["cpu"], chunks=4, threads=1), x)
    for a, b in zip(grads(pipe, x), ref):
        assert torch.equal(a, b)


def test_units_without_gradient_keep_none():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 4), pipelstm.LSTM(4, 8), nn.Linear(8, 3))
    pipe = pipelstm.Pipeline(model, devices=["cpu", "cpu"], balance=[2, 1], chunks=3, threads=1)
    _, (h, _) = pipe(torch.randint(0, 11, (6, 2)))
    h.sum().backward()  # nothing reaches the decoder
    assert pipe[2].weight.grad is None and pipe[2].bias.grad is None
    assert pipe[0].weight.grad is not None and pipe[1].weight_ih_l0.grad is not None
