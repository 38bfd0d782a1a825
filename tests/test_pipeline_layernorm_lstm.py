"""pipelstm.LayerNormLSTM in a Pipeline: each layer a unit on its stage (the
fused LayerNorm layer op over each item, its state carried over the time
chunks), dense and packed input, with recomputation; the output, h_n, c_n
and every gradient (initial states, every parameter, the norms' gains
included) equal the unsplit model's in float64."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from pipelstm.pipeline.units import flatten

from distributed_utils import needs_gloo

TOL = dict(rtol=1e-10, atol=1e-10)
V, E, H, L = 19, 6, 8, 3
LENGTHS = [9, 2, 7, 1, 9, 3]  # with K = 6 the short micro-batches have items without rows


def _model(bias: bool) -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, E), pipelstm.LayerNormLSTM(E, H, L, bias=bias, eps=1e-4),
                          nn.Linear(H, V)).double()
    with torch.no_grad():  # gains and shifts away from 1 and 0, so that a missing norm shows
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5) if "weight" in name else p.uniform_(-0.5, 0.5)
    return model


def _unsplit(model, x, hx):
    emb, lstm, dec = model
    if isinstance(x, torch.Tensor):
        out, (h_n, c_n) = lstm(emb(x), hx)
        return dec(out), h_n, c_n
    out, (h_n, c_n) = lstm(x._replace(data=emb(x.data)), hx)
    return out._replace(data=dec(out.data)), h_n, c_n


def _check(model, pipe, x, B):
    hx = (torch.randn(L, B, H, dtype=torch.float64), torch.randn(L, B, H, dtype=torch.float64))
    results = []
    for run in (lambda h: pipe(x, h), lambda h: _unsplit(model, x, h)):
        h = tuple(t.clone().requires_grad_() for t in hx)
        got = run(h)
        out, h_n, c_n = (got[0], *got[1]) if len(got) == 2 else got
        data = out if isinstance(out, torch.Tensor) else out.data
        (data.sin().sum() + h_n.cos().sum() + c_n.square().sum()).backward()
        results.append((data, h_n, c_n, h[0].grad, h[1].grad))
    for name, a, b in zip(("output", "h_n", "c_n", "grad h0", "grad c0"), *results):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")
    for (name, pa), (_, pb) in zip(pipe.named_parameters(), model.named_parameters()):
        assert pa.grad is not None and pb.grad is not None, name
        torch.testing.assert_close(pa.grad, pb.grad, **TOL, msg=lambda m: f"{name}: {m}")


def test_each_layer_is_a_layernorm_lstm_unit():
    model = _model(bias=True)
    units = flatten(model.named_children())
    assert [u.kind for u in units] == ["embedding"] + ["layernorm_lstm"] * L + ["linear"]
    lstm = units[1]
    assert lstm.options == {"eps": 1e-4}
    assert lstm.param_names == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "layer_norm_ih_weight_l0",
                                "layer_norm_hh_weight_l0", "layer_norm_c_weight_l0", "layer_norm_c_bias_l0"]
    assert [u.layer for u in units[1:4]] == [0, 1, 2]
    no_bias = flatten(_model(bias=False).named_children())[2]
    assert no_bias.param_names[2:4] == [None, None] and no_bias.param_names[-1] is None


# units: 0 (Embedding), 1.l0, 1.l1, 1.l2, 2 (Linear)
@pytest.mark.parametrize("balance, K, M, checkpoint", [
    ([2, 3], 1, 1, "never"), ([1, 4], 3, 2, "always"), ([3, 2], 4, 3, "except_last"),
])
@pytest.mark.parametrize("bias", [True, False])
def test_pipeline_matches_unsplit(balance, K, M, checkpoint, bias):
    model = _model(bias)
    pipe = pipelstm.Pipeline(copy.deepcopy(model), ["cpu", "cpu"], chunks=K, micro_batches=M, balance=balance,
                             checkpoint=checkpoint)
    x = torch.randint(0, V, (9, 6))
    _check(model, pipe, x, 6)


@pytest.mark.parametrize("K, M, checkpoint", [(1, 1, "never"), (3, 2, "always"), (6, 3, "never")])
def test_packed_pipeline_matches_unsplit(K, M, checkpoint):
    model = _model(bias=True)
    pipe = pipelstm.Pipeline(copy.deepcopy(model), ["cpu", "cpu"], chunks=K, micro_batches=M, balance=[2, 3],
                             checkpoint=checkpoint)
    g = torch.Generator().manual_seed(1)
    seq = pack_sequence([torch.randint(0, V, (n,), generator=g) for n in LENGTHS], enforce_sorted=False)
    _check(model, pipe, seq, len(LENGTHS))


@needs_gloo
def test_pipeline_parallel_trains_it_and_keeps_its_state_dict(mesh):
    # PipelineParallel (a gloo group of one) on the same units: the loss and
    # every gradient equal the unsplit model's, and its state_dict is the
    # model's, the norms' gains included.
    model = _model(bias=True)
    pipe = pipelstm.distributed.PipelineParallel(copy.deepcopy(model), mesh, chunks=3, micro_batches=2, threads=1,
                                                 carry_state=False, loss_fn=nn.CrossEntropyLoss())
    x, y = torch.randint(0, V, (9, 4)), torch.randint(0, V, (9, 4))
    loss = pipe.train_step(x, y)
    logits = _unsplit(model, x, None)[0]
    ref = nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), **TOL)
    ref_params = dict(model.named_parameters())
    stage = dict(pipe.named_stage_parameters())
    assert set(stage) == set(ref_params)
    for name, p in stage.items():
        torch.testing.assert_close(p.grad, ref_params[name].grad, **TOL, msg=lambda m: f"{name}: {m}")
    state = pipe.state_dict()
    want = model.state_dict()
    assert set(state) == set(want) and "1.layer_norm_c_bias_l2" in state
    fresh = _model(bias=True)
    assert all(torch.equal(state[k], fresh.state_dict()[k]) for k in state)  # no step taken: the initial values
