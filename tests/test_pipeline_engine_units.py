"""The pipeline engine's units (csrc/pipeline/units.cpp), one kind and option
at a time, through the public ``pipelstm.Pipeline``: in float64, outputs,
final states and every gradient (parameters, input, initial states) within
1e-12 of the same modules run unsplit by plain torch.

What the other pipeline tests already check against the unsplit model, and
so is not repeated here:

* lstm: test_pipeline.py (language, projected and nn.LSTM models, float32),
  test_pipeline_weights.py (weight gradients bitwise), test_lstm_devices.py.
* embedding (no padding_idx, no scale_grad_by_freq), linear (with bias):
  the language models of test_pipeline.py.
* dropout (0 < p < 1, training, with the masks the pass drew):
  test_pipeline.py::test_dropout_gradients_match_unsplit_with_the_same_masks
  and test_dropout_statistics_and_eval.
* activation (all six) and layer_norm (with weight, with and without bias):
  test_pipeline.py::test_pointwise_layers_match_unsplit, all in one float32
  model within 1e-6.
* cross_entropy (ignore_index, mean and sum, recomputed): test_pipeline_loss.py.

Added here: each activation alone in float64 (a wrong derivative in one of
them, e.g. GELU's exact form for its tanh form, is 1e-4 and more); LayerNorm
without elementwise affine and with its own eps; Linear without bias;
Embedding with padding_idx and scale_grad_by_freq (its weight gradient
counts the indices over the whole batch, not per work item); Dropout with
p = 0 and p = 1 in training (deterministic, so compared without masks);
RMSNorm (rms_norm), which no other test covers: alone against torch's, in
a model against the unsplit one, recomputed, and its default eps.
"""

import copy

import pytest
import torch
from torch import nn

import pipelstm
from reference import num_threads, rel_error

F64 = torch.float64
TOL = 1e-12
T, B, H = 9, 4, 5


def assert_matches_unsplit(model, x, balance, K=3, M=2):
    """``model`` (float64) is a Sequential ending in an nn.LSTM(·, H). The
    Pipeline of it (one thread per stage, K chunks, M micro-batches) against
    the same modules run unsplit: outputs, final states and the gradients of
    a weighted loss of all three w.r.t. every parameter, the input (if it is
    floating point) and the initial states."""
    ref = copy.deepcopy(model)
    pipe = pipelstm.Pipeline(copy.deepcopy(model), devices=["cpu"] * len(balance), balance=balance, chunks=K,
                             micro_batches=M, threads=1)
    assert pipe.balance == balance
    hx = (torch.randn(1, B, H, dtype=F64), torch.randn(1, B, H, dtype=F64))

    def leaves():
        x_ = x.clone().requires_grad_() if x.is_floating_point() else x
        return x_, tuple(t.clone().requires_grad_() for t in hx)

    x_p, hx_p = leaves()
    x_r, hx_r = leaves()
    out_p, (h_p, c_p) = pipe(x_p, hx_p)
    with num_threads(1):
        out_r, (h_r, c_r) = ref[-1](ref[:-1](x_r), hx_r)
    for what, a, b in (("output", out_p, out_r), ("h_n", h_p, h_r), ("c_n", c_p, c_r)):
        assert a.shape == b.shape, what
        err = rel_error(a, b)
        assert err <= TOL, (what, err)

    gen = torch.Generator().manual_seed(2)
    g = [torch.randn(t.shape, dtype=F64, generator=gen) for t in (out_r, h_r, c_r)]
    sum((t * gt).sum() for t, gt in zip((out_p, h_p, c_p), g)).backward()
    with num_threads(1):
        sum((t * gt).sum() for t, gt in zip((out_r, h_r, c_r), g)).backward()
    assert [n for n, _ in pipe.named_parameters()] == [n for n, _ in ref.named_parameters()]
    got = [(n, p.grad) for n, p in pipe.named_parameters()] + [("h0", hx_p[0].grad), ("c0", hx_p[1].grad)]
    expected = [p.grad for p in ref.parameters()] + [hx_r[0].grad, hx_r[1].grad]
    if x.is_floating_point():
        got.append(("input", x_p.grad))
        expected.append(x_r.grad)
    for (n, a), b in zip(got, expected):
        assert a is not None and b is not None, n
        err = rel_error(a, b)
        assert err <= TOL, (f"gradient of {n}", err)
    return pipe


ACTIVATIONS = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
}


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_each_activation_matches_unsplit(activation):
    # The activation is a stage of its own, between a Linear and an LSTM.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), ACTIVATIONS[activation](), nn.LSTM(6, H)).double()
    x = 2 * torch.randn(T, B, 4, dtype=F64)  # inputs well into the curved and saturated parts
    assert_matches_unsplit(model, x, balance=[1, 1, 1])


@pytest.mark.parametrize("kw", [dict(elementwise_affine=False), dict(eps=0.5), dict(elementwise_affine=False, eps=0.5)],
                         ids=["no_affine", "eps", "no_affine_eps"])
def test_layer_norm_options_match_unsplit(kw):
    # eps = 0.5, of the order of the variance, changes every output noticeably.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6, **kw), nn.LSTM(6, H)).double()
    if "elementwise_affine" not in kw:
        with torch.no_grad():  # not the initial ones and zeros
            model[1].weight.uniform_(0.5, 1.5)
            model[1].bias.uniform_(-0.5, 0.5)
    assert_matches_unsplit(model, torch.randn(T, B, 4, dtype=F64), balance=[2, 1])


def test_linear_without_bias_matches_unsplit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6, bias=False), nn.Tanh(), nn.Linear(6, 6, bias=False), nn.LSTM(6, H)).double()
    pipe = assert_matches_unsplit(model, torch.randn(T, B, 4, dtype=F64), balance=[1, 2, 1])
    assert pipe[0].bias is None and pipe[2].bias is None


@pytest.mark.parametrize("padding_idx, scale_grad_by_freq", [(2, False), (None, True), (2, True), (-1, True)])
def test_embedding_options_match_unsplit(padding_idx, scale_grad_by_freq):
    # A small vocabulary, so indices repeat within and across the work items
    # (K = 3 chunks x M = 2 micro-batches): scale_grad_by_freq divides each
    # row's gradient by the index's count over the whole batch.
    torch.manual_seed(0)
    V = 6
    model = nn.Sequential(nn.Embedding(V, 4, padding_idx=padding_idx, scale_grad_by_freq=scale_grad_by_freq),
                          nn.LSTM(4, H)).double()
    x = torch.randint(0, V, (T, B))
    pad = None if padding_idx is None else padding_idx % V
    if pad is not None:
        x[0, :2] = x[5, 3] = pad
        assert model[0].padding_idx == pad
    counts = torch.bincount(x.reshape(-1), minlength=V)
    assert counts.max() > 1 and (counts > 0).all()
    pipe = assert_matches_unsplit(model, x, balance=[1, 1])
    if pad is not None:
        assert torch.equal(pipe[0].weight.grad[pad], torch.zeros(4, dtype=F64))
        assert pipe[0].weight.grad.abs().sum(1).gt(0).sum() == V - 1


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_dropout_zero_and_one_in_training_match_unsplit(p):
    # p = 0 passes the input on; p = 1 zeroes it and its gradient, so the
    # Linear before it gets zero gradients.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(p), nn.LSTM(6, H)).double()
    assert model.training
    pipe = assert_matches_unsplit(model, torch.randn(T, B, 4, dtype=F64), balance=[1, 1, 1])
    if p == 1.0:
        assert torch.equal(pipe[0].weight.grad, torch.zeros(6, 4, dtype=F64))


@pytest.mark.parametrize("kw", [dict(), dict(eps=0.5), dict(elementwise_affine=False, eps=0.5)],
                         ids=["default", "eps", "no_affine_eps"])
def test_rms_norm_matches_torch_and_unsplit(kw):
    # Alone, the unit against torch's RMSNorm (forward, input and weight
    # gradients); then between a Linear and an LSTM against the unsplit model.
    torch.manual_seed(0)
    norm = nn.RMSNorm(6, **kw).double()
    if norm.weight is not None:
        with torch.no_grad():  # not the initial ones
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(T, B, 6, dtype=F64)
    pipe = pipelstm.Pipeline(copy.deepcopy(nn.Sequential(norm)), devices=["cpu"], chunks=3, micro_batches=2)
    x_p, x_r = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_p, y_r = pipe(x_p)[0], norm(x_r)
    assert rel_error(y_p, y_r) <= TOL
    g = torch.randn(T, B, 6, dtype=F64)
    (y_p * g).sum().backward()
    (y_r * g).sum().backward()
    assert rel_error(x_p.grad, x_r.grad) <= TOL
    if norm.weight is not None:
        assert rel_error(pipe[0].weight.grad, norm.weight.grad) <= TOL
    model = nn.Sequential(nn.Linear(4, 6), copy.deepcopy(norm), nn.LSTM(6, H)).double()
    assert_matches_unsplit(model, torch.randn(T, B, 4, dtype=F64), balance=[2, 1])
    assert_matches_unsplit(model, torch.randn(T, B, 4, dtype=F64), balance=[1, 1, 1])
    # Recomputed (its forward replayed before its backward): bitwise the same gradients.
    grads = []
    for checkpoint in ("never", "always"):
        pipe = pipelstm.Pipeline(copy.deepcopy(model), devices=["cpu"] * 2, balance=[2, 1], chunks=3,
                                 micro_batches=2, checkpoint=checkpoint)
        pipe(x.new_ones(T, B, 4))[0].sum().backward()
        grads.append([p.grad for p in pipe.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_rms_norm_default_eps_is_the_dtypes():
    # eps=None is torch's default, the machine epsilon of the input's dtype:
    # with a mean square of 1e-8 in float32 it moves every output by percents.
    torch.manual_seed(0)
    norm = nn.RMSNorm(6)
    x = 1e-4 * torch.randn(T, B, 6)
    pipe = pipelstm.Pipeline(nn.Sequential(copy.deepcopy(norm)), devices=["cpu"], chunks=2)
    assert rel_error(pipe(x)[0], norm(x)) <= 1e-6
    assert rel_error(nn.RMSNorm(6, eps=0.0)(x), norm(x)) > 1e-3
