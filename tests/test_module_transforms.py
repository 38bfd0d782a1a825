"""torch.func, forward-mode AD and double backward through pipelstm's modules.

The fused ops have reverse-mode formulas only; under these transforms the
ops run on their ATen composition (csrc/lstm_composite.cpp, chosen in
pipelstm/ops.py). Every result is compared with nn.LSTM / nn.LSTMCell
holding the same weights in float64 (whose CPU path supports all of them),
with finite differences, or with torch.autograd.gradgradcheck.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import torch.autograd.forward_ad as fwAD
from torch import nn
from torch.func import functional_call, grad, jacrev, jvp, vjp, vmap
from torch.nn.utils.rnn import pack_padded_sequence

import pipelstm
from lstm_pairs import assert_all_close, pair, weighted_loss
from reference import rel_error

F64 = torch.float64
CONFIGS = {
    "plain": dict(input_size=4, hidden_size=6),
    "stacked_bidirectional_proj": dict(input_size=4, hidden_size=6, num_layers=2, bidirectional=True, proj_size=3),
    "no_bias_batch_first": dict(input_size=4, hidden_size=5, num_layers=2, bias=False, batch_first=True),
}


def _input(kw, T=5, B=3):
    shape = (B, T, kw["input_size"]) if kw.get("batch_first") else (T, B, kw["input_size"])
    return torch.randn(shape, dtype=F64)


def _loss(params, model, x):
    out, (h, c) = functional_call(model, params, (x,))
    return weighted_loss(out, h, c)


def _params(m):
    return {k: v.detach() for k, v in m.named_parameters()}


# --- torch.func: grad, vjp, jacrev, vmap -------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
def test_func_grad_matches_nn_lstm(config):
    ref, ours = pair(F64, **CONFIGS[config])
    x = _input(CONFIGS[config])
    got, expected = grad(_loss)(_params(ours), ours, x), grad(_loss)(_params(ref), ref, x)
    assert list(got) == list(expected)
    assert_all_close(list(got.values()), list(expected.values()), 1e-12)


def test_func_vjp_and_jacrev_match_nn_lstm():
    ref, ours = pair(F64, **CONFIGS["stacked_bidirectional_proj"])
    x = _input(CONFIGS["stacked_bidirectional_proj"], T=3, B=2)
    f = lambda m: lambda x: m(x)[0]  # noqa: E731
    out, pull = vjp(f(ours), x)
    ref_out, ref_pull = vjp(f(ref), x)
    cotangent = torch.randn_like(out)
    assert_all_close([out, *pull(cotangent)], [ref_out, *ref_pull(cotangent)], 1e-12)
    assert_all_close([jacrev(f(ours))(x)], [jacrev(f(ref))(x)], 1e-12)


@pytest.mark.parametrize("config", ["plain", "stacked_bidirectional_proj"])
def test_per_sample_gradients_match_one_backward_per_sample(config):
    # vmap(grad(loss)) over the batch: what differential-privacy training
    # needs. Reference: nn.LSTM's gradient of each sample on its own.
    kw = CONFIGS[config]
    ref, ours = pair(F64, **kw)
    x = _input(kw, T=4, B=3)

    def sample_loss(params, model, xi):  # no random weights: nothing random inside vmap
        out, (h, c) = functional_call(model, params, (xi.unsqueeze(1),))
        return out.sin().sum() + h.pow(2).sum() + (c * 0.5).exp().sum()

    got = vmap(grad(sample_loss), in_dims=(None, None, 1))(_params(ours), ours, x)
    for name, per_sample in got.items():
        expected = torch.stack([grad(sample_loss)(_params(ref), ref, x[:, b])[name] for b in range(x.size(1))])
        assert rel_error(per_sample, expected) <= 1e-12, name


def test_vmap_over_inputs_matches_a_loop():
    ref, ours = pair(F64, **CONFIGS["stacked_bidirectional_proj"])
    xs = torch.randn(3, 5, 2, 4, dtype=F64)
    got = vmap(lambda x: ours(x)[0])(xs)
    assert rel_error(got, torch.stack([ref(x)[0] for x in xs])) <= 1e-12


def test_func_grad_over_packed_input_matches_nn_lstm():
    # nn.LSTM itself raises here (its packed path reads batch_sizes' data
    # under the transform); the reference is its ordinary autograd gradient.
    kw = CONFIGS["stacked_bidirectional_proj"]
    ref, ours = pair(F64, **kw)
    x = _input(kw, T=5, B=3)
    lengths = torch.tensor([2, 5, 3])

    def loss(params, model):
        out, (h, c) = functional_call(model, params, (pack_padded_sequence(x, lengths, enforce_sorted=False),))
        return weighted_loss(out.data, h, c)

    got = grad(loss)(_params(ours), ours)
    expected = torch.autograd.grad(loss(dict(ref.named_parameters()), ref), list(ref.parameters()))
    assert_all_close(list(got.values()), list(expected), 1e-12)


def test_compiled_func_grad_matches_eager():
    _, ours = pair(F64, **CONFIGS["plain"])
    x = _input(CONFIGS["plain"])

    def loss(params, x):  # no random weights: torch.compile cannot make a Generator
        out, (h, c) = functional_call(ours, params, (x,))
        return out.sin().sum() + h.pow(2).sum() + c.sum()

    compiled = torch.compile(lambda p, x: grad(loss)(p, x), backend="aot_eager", fullgraph=True)
    got, expected = compiled(_params(ours), x), grad(loss)(_params(ours), x)
    assert_all_close(list(got.values()), list(expected.values()), 1e-12)


# --- forward mode ------------------------------------------------------------------


def _forward_mode_tangent(how, f, x, t):
    if how == "jvp":
        return jvp(f, (x,), (t,))[1]
    if how == "jacfwd":
        return (torch.func.jacfwd(f)(x) * t).flatten(-t.dim()).sum(-1)
    if how == "linearize":
        return torch.func.linearize(f, x)[1](t)
    if how == "forward_ad":
        with fwAD.dual_level():
            return fwAD.unpack_dual(f(fwAD.make_dual(x, t))).tangent
    if how in ("compiled_jvp", "compiled_jvp_inductor"):
        backend = "inductor" if how.endswith("inductor") else "aot_eager"
        compiled = torch.compile(lambda a, b: jvp(f, (a,), (b,))[1], backend=backend, fullgraph=True, dynamic=False)
        return compiled(x, t)
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["jvp", "jacfwd", "linearize", "forward_ad", "compiled_jvp", "compiled_jvp_inductor"])
@pytest.mark.parametrize("module", ["LSTM", "LSTMCell"])
def test_forward_mode_tangent_matches_nn_and_finite_differences(module, how):
    # Regression: eager jvp used to return all-zero tangents, and compiled
    # jvp did until the ops ran on their composition under transforms.
    torch.manual_seed(0)
    if module == "LSTM":
        ref, ours = pair(F64, **CONFIGS["stacked_bidirectional_proj"])
        x = torch.randn(3, 2, 4, dtype=F64)
    else:
        ref, ours = nn.LSTMCell(4, 6).double(), pipelstm.LSTMCell(4, 6).double()
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(2, 4, dtype=F64)
    t = torch.randn_like(x)
    f = lambda a: ours(a)[0]  # noqa: E731
    tangent = _forward_mode_tangent(how, f, x, t)
    eps = 1e-6
    with torch.no_grad():
        finite_difference = (f(x + eps * t) - f(x - eps * t)) / (2 * eps)
    assert finite_difference.abs().max() > 1e-3
    assert rel_error(tangent, finite_difference) <= 1e-6
    assert rel_error(tangent, jvp(lambda a: ref(a)[0], (x,), (t,))[1]) <= 1e-12


# --- double backward ---------------------------------------------------------------


def _second_order(kind, model):
    """The gradients of a second-order objective (as in gradient penalties
    and meta-learning) with respect to the input and every parameter."""
    torch.manual_seed(0)
    x = torch.randn(5, 2, 4, dtype=F64, requires_grad=True)
    params = list(model.parameters())
    if kind == "cell":
        (g,) = torch.autograd.grad(model(x[0])[0].pow(2).sum(), model.weight_ih, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), [x, *params])
    if kind == "dx_dx":
        (g,) = torch.autograd.grad(model(x)[0].pow(2).sum(), x, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), [x, *params])
    if kind == "gradient_penalty_on_parameters":
        gs = torch.autograd.grad(model(x)[0].pow(2).sum(), params, create_graph=True)
        return torch.autograd.grad(sum(g.pow(2).sum() for g in gs), [x, *params])
    if kind == "packed":
        packed = pack_padded_sequence(x, torch.tensor([2, 5]), enforce_sorted=False)
        out, (h, c) = model(packed)
        (g,) = torch.autograd.grad(weighted_loss(out.data, h, c), x, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), [x, *params])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["dx_dx", "gradient_penalty_on_parameters", "packed", "cell"])
def test_double_backward_matches_nn_lstm(kind):
    if kind == "cell":
        ref, ours = nn.LSTMCell(4, 6).double(), pipelstm.LSTMCell(4, 6).double()
        ours.load_state_dict(ref.state_dict())
    else:
        ref, ours = pair(F64, **CONFIGS["stacked_bidirectional_proj"])
    got, expected = _second_order(kind, ours), _second_order(kind, ref)
    assert all(g.abs().max() > 0 for g in expected[:2])  # (the cell from zero state: w_hh has none)
    assert_all_close(list(got), list(expected), 1e-11)


def _module_function(model, packed):
    names = [n for n, _ in model.named_parameters()]

    def f(x, *params):
        inp = pack_padded_sequence(x, torch.tensor([3, 1]), enforce_sorted=False) if packed else x
        out, (h, c) = functional_call(model, dict(zip(names, params)), (inp,))
        return (out.data if packed else out), h, c

    return f


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_gradgradcheck_module_input_and_parameters(packed):
    torch.manual_seed(0)
    model = pipelstm.LSTM(2, 3, num_layers=2, bidirectional=True, proj_size=2).double()
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    assert torch.autograd.gradgradcheck(_module_function(model, packed), (x, *params))


def test_gradgradcheck_cell():
    torch.manual_seed(0)
    cell = pipelstm.LSTMCell(2, 3).double()
    x = torch.randn(2, 2, dtype=F64, requires_grad=True)
    hx = tuple(torch.randn(2, 3, dtype=F64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradgradcheck(lambda x, h, c: cell(x, (h, c)), (x, *hx))


def test_create_graph_without_a_second_lstm_derivative_is_correct():
    # create_graph=True where the second-order term never differentiates the
    # LSTM's backward (a gradient penalty on a decoder weight).
    ref, ours = pair(F64)
    decoder = torch.randn(3 * 2, 1, dtype=F64, requires_grad=True)
    x = torch.randn(5, 2, 4, dtype=F64, requires_grad=True)

    def run(m):
        y = m(x)[0] @ decoder
        (g,) = torch.autograd.grad(y.pow(2).sum(), decoder, create_graph=True)
        return torch.autograd.grad(g.pow(2).sum(), [x, decoder, *m.parameters()])

    assert_all_close(list(run(ours)), list(run(ref)), 1e-10)


# --- the fused kernels stay the default ----------------------------------------------


def test_plain_training_never_runs_the_composition(monkeypatch):
    # The composition is for transforms only: an ordinary forward and
    # backward (dense and packed) must stay on the fused ops.
    calls = []
    for name in ("lstm_layer_composite", "lstm_packed_layer_composite", "lstm_cell_composite"):
        op = getattr(torch.ops.pipelstm, name)
        monkeypatch.setattr(torch.ops.pipelstm, name, lambda *a, _op=op, _n=name: calls.append(_n) or _op(*a))
    _, ours = pair(F64, **CONFIGS["stacked_bidirectional_proj"])
    x = torch.randn(5, 2, 4, dtype=F64, requires_grad=True)
    weighted_loss(*(lambda o, hc: (o, *hc))(*ours(x))).backward()
    out, (h, c) = ours(pack_padded_sequence(x, torch.tensor([2, 5]), enforce_sorted=False))
    weighted_loss(out.data, h, c).backward()
    assert calls == []
    grad(_loss)(_params(ours), ours, x.detach())
    assert "lstm_layer_composite" in calls


class _PipelstmOps(TorchDispatchMode):
    """The pipelstm ops that reach the kernels, in order (below autograd)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "pipelstm":
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_plain_backward_runs_the_fused_backward_ops_and_create_graph_does_not():
    # The formulas are C++ (csrc/lstm_autograd.cpp): whichever backward they
    # take shows below autograd as the fused backward op being called, or not.
    _, ours = pair(F64, **CONFIGS["stacked_bidirectional_proj"])  # 2 layers x 2 directions
    x = torch.randn(5, 2, 4, dtype=F64, requires_grad=True)
    out = ours(x)[0].pow(2).sum()
    with _PipelstmOps() as seen:
        out.backward()
    assert seen.names == ["lstm_layer_backward.default"] * 4
    out = ours(x)[0].pow(2).sum()
    with _PipelstmOps() as seen:
        torch.autograd.grad(out, x, create_graph=True)
    assert seen.names == []
