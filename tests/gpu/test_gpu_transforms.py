"""On CUDA, what the CPU suite proves of transforms and of non-finite values
(tests/test_module_transforms.py, tests/test_cpu_fused_kernels.py):

* torch.func grad, vjp, per-sample gradients (vmap(grad)) and forward-mode
  jvp, and double backward (gradgradcheck), in float64 on the GPU, against
  nn.LSTM in float64 on the CPU (its non-cuDNN path supports them all);
* NaN and inf from the input, the initial state or a weight (with no hx)
  land exactly where cuDNN's float32 LSTM puts them, in the outputs and in
  every gradient;
* a saturated gate has a zero derivative: with w_hh scaled by 1e30 the
  input gradient is nn.LSTM's (float64), finite.
"""

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jvp, vjp, vmap

import pipelstm
from reference import rel_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
F64 = torch.float64
KW = dict(input_size=4, hidden_size=6, num_layers=2, bidirectional=True, proj_size=3)


def _pair(dtype=F64, ref_device="cpu", **kw):
    """(nn.LSTM on ref_device, pipelstm.LSTM on the GPU) with the same weights."""
    kw = kw or KW
    torch.manual_seed(0)
    ref = nn.LSTM(**kw).to(dtype)
    ours = pipelstm.LSTM(**kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref.to(ref_device), ours.to(DEVICE)


def _loss(out, h, c):
    """Every element weighted differently (a plain sum hides sign and order errors)."""
    return sum((t * torch.linspace(-1, 1, t.numel(), dtype=t.dtype, device=t.device).view_as(t)).sum()
               for t in (out, h, c))


def _params(m):
    return {k: v.detach() for k, v in m.named_parameters()}


def _model_loss(params, model, x):
    out, (h, c) = functional_call(model, params, (x,))
    return _loss(out, h, c)


def _close(actual, expected, tol=1e-10, what=""):
    err = rel_error(actual.detach().cpu().double(), expected.detach().cpu().double())
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def test_func_grad_and_vjp_match_nn_lstm_float64():
    ref, ours = _pair()
    x = torch.randn(5, 3, 4, dtype=F64)
    got = grad(_model_loss)(_params(ours), ours, x.to(DEVICE))
    expected = grad(_model_loss)(_params(ref), ref, x)
    assert list(got) == list(expected)
    for name in expected:
        _close(got[name], expected[name], what=name)
    out, pull = vjp(lambda x: ours(x)[0], x.to(DEVICE))
    ref_out, ref_pull = vjp(lambda x: ref(x)[0], x)
    cotangent = torch.randn_like(ref_out)
    _close(out, ref_out, what="output")
    _close(pull(cotangent.to(DEVICE))[0], ref_pull(cotangent)[0], what="input gradient")


def test_per_sample_gradients_match_one_backward_per_sample():
    ref, ours = _pair()
    x = torch.randn(4, 3, 4, dtype=F64)

    def sample_loss(params, model, xi):
        out, (h, c) = functional_call(model, params, (xi.unsqueeze(1),))
        return out.sin().sum() + h.pow(2).sum() + (c * 0.5).exp().sum()

    got = vmap(grad(sample_loss), in_dims=(None, None, 1))(_params(ours), ours, x.to(DEVICE))
    for name, per_sample in got.items():
        expected = torch.stack([grad(sample_loss)(_params(ref), ref, x[:, b])[name] for b in range(x.size(1))])
        _close(per_sample, expected, what=name)


def test_forward_mode_jvp_matches_nn_lstm():
    ref, ours = _pair()
    x, tangent = torch.randn(5, 3, 4, dtype=F64), torch.randn(5, 3, 4, dtype=F64)
    out, out_tangent = jvp(lambda x: ours(x)[0], (x.to(DEVICE),), (tangent.to(DEVICE),))
    ref_out, ref_tangent = jvp(lambda x: ref(x)[0], (x,), (tangent,))
    _close(out, ref_out, what="output")
    _close(out_tangent, ref_tangent, what="tangent")


def test_gradgradcheck_input_and_parameters():
    _, ours = _pair(input_size=3, hidden_size=4, num_layers=2, proj_size=2)
    names = [n for n, _ in ours.named_parameters()]
    x = torch.randn(3, 2, 3, dtype=F64, device=DEVICE, requires_grad=True)
    params = [p.detach().clone().requires_grad_() for p in ours.parameters()]

    def f(x, *ps):
        out, (h, c) = functional_call(ours, dict(zip(names, ps)), (x,))
        return out, h, c

    assert torch.autograd.gradgradcheck(f, (x, *params), fast_mode=True)


def test_double_backward_matches_nn_lstm():
    ref, ours = _pair()
    x = torch.randn(5, 3, 4, dtype=F64)

    def penalty(model, x):
        x = x.clone().requires_grad_()
        out, (h, c) = model(x)
        (gx,) = torch.autograd.grad(_loss(out, h, c), x, create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), list(model.parameters()))

    for k, (a, e) in enumerate(zip(penalty(ours, x.to(DEVICE)), penalty(ref, x))):
        _close(a, e, what=f"parameter {k}")


NON_FINITE = [float("nan"), float("inf"), -float("inf")]


def _outputs_and_grads(model, x, hx):
    leaves = [x.clone().requires_grad_()] + ([t.clone().requires_grad_() for t in hx] if hx else [])
    out, (h, c) = model(leaves[0], tuple(leaves[1:]) if hx else None)
    (out.sum() + h.sum() + c.sum()).backward()
    got = [out, h, c, *(t.grad for t in leaves), *(p.grad for p in model.parameters())]
    model.zero_grad()
    return got


@pytest.mark.parametrize("value", NON_FINITE, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["x", "h0", "c0", "weight_hh_l0", "weight_ih_l0", "bias_hh_l0"])
def test_non_finite_values_land_where_cudnn_puts_them(value, where):
    kw = dict(input_size=3, hidden_size=8)
    ref, ours = _pair(torch.float32, ref_device=DEVICE, **kw)  # cuDNN's float32 LSTM
    x, h0, c0 = (torch.randn(4, 3, 3, device=DEVICE), torch.randn(1, 3, 8, device=DEVICE),
                 torch.randn(1, 3, 8, device=DEVICE))
    hx = (h0, c0)
    if where in ("x", "h0", "c0"):
        {"x": x[1, 0], "h0": h0[0, 1], "c0": c0[0, 2]}[where][-1] = value
    else:  # a weight, and no hx: the first step starts from zeros
        hx = None
        with torch.no_grad():
            for m in (ref, ours):
                getattr(m, where).view(-1)[1] = value
    for k, (a, e) in enumerate(zip(_outputs_and_grads(ours, x, hx), _outputs_and_grads(ref, x, hx))):
        assert torch.equal(a.isnan(), e.isnan()) and torch.equal(a.isinf(), e.isinf()), (
            f"item {k}: NaN/inf pattern differs from cuDNN's ({where} = {value})")


def test_a_saturated_gate_has_a_zero_derivative():
    ref, ours = _pair(input_size=3, hidden_size=5)
    with torch.no_grad():
        for m in (ref, ours):
            m.weight_hh_l0.mul_(1e30)
    ours = ours.float()
    x = torch.randn(6, 2, 3, dtype=F64)
    h0 = torch.randn(1, 2, 5, dtype=F64)
    got = _outputs_and_grads(ours, x.float().to(DEVICE), (h0.float().to(DEVICE), torch.zeros_like(h0).float().to(DEVICE)))
    expected = _outputs_and_grads(ref, x, (h0, torch.zeros_like(h0)))
    assert torch.isfinite(got[3]).all()
    _close(got[3], expected[3], tol=1e-5, what="input gradient")
