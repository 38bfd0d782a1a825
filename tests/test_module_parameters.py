"""pipelstm.LSTM with its parameters replaced: functional_call,
parametrizations (custom and weight_norm) that really train, weights tied
within one module and shared between two.

The reference is always independent of pipelstm: nn.LSTM holding the same
weights (load_state_dict), or the same module run eagerly.
"""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from lstm_pairs import KW, assert_all_close, forward_and_grads, pair, weighted_loss
from reference import rel_error


def sgd_steps(model, x, steps=3, lr=0.5):
    """A few steps of plain training; returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out, (h, c) = model(x)
        loss = weighted_loss(out, h, c)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_functional_call_with_swapped_parameters():
    ref, ours = pair()
    before = copy.deepcopy(ours.state_dict())
    other = {k: torch.randn_like(v, requires_grad=True) for k, v in ours.named_parameters()}
    x = torch.randn(5, 2, 4, requires_grad=True)
    out, (h, c) = torch.func.functional_call(ours, other, (x,))
    got = [out, h, c, *torch.autograd.grad(weighted_loss(out, h, c), [x, *other.values()])]
    holder = nn.LSTM(**KW)  # a model that holds those parameters
    holder.load_state_dict({k: v.detach() for k, v in other.items()})
    assert_all_close(got, forward_and_grads(holder, x), 1e-5)
    # The module's own parameters were neither used nor changed.
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items())
    assert all(p.grad is None for p in ours.parameters())


class _Scale(nn.Module):
    def forward(self, w):
        return 2.0 * w


def _plain_with_effective_weights(parametrized):
    """An un-parametrized nn.LSTM holding the effective (parametrized) weights."""
    plain = nn.LSTM(**KW)
    with torch.no_grad():
        plain.load_state_dict({n: getattr(parametrized, n).detach().clone() for n in plain._flat_weights_names})
    return plain


@pytest.mark.parametrize("kind", ["custom", "weight_norm"])
def test_parametrization_is_used_and_really_trains(kind):
    ref, ours = pair()
    if kind == "custom":
        for m in (ref, ours):
            parametrize.register_parametrization(m, "weight_hh_l0", _Scale())
    else:
        ref = torch.nn.utils.parametrizations.weight_norm(ref, "weight_hh_l0")
        ours = torch.nn.utils.parametrizations.weight_norm(ours, "weight_hh_l0")
        with torch.no_grad():  # magnitudes g != |v|, so the effective weight is not v itself
            ref.parametrizations.weight_hh_l0.original0.mul_(torch.linspace(0.5, 1.5, 24).unsqueeze(1))
    ours.load_state_dict(ref.state_dict(), strict=True)
    originals = dict(ours.parametrizations.weight_hh_l0.named_parameters())
    assert set(originals) == ({"original"} if kind == "custom" else {"original0", "original1"})
    before = {k: v.detach().clone() for k, v in originals.items()}

    # The forward uses the parametrized weight: the same as an nn.LSTM that
    # simply holds that effective weight (which differs from the stored original).
    x = torch.randn(5, 2, 4, requires_grad=True)
    plain = _plain_with_effective_weights(ours)
    assert rel_error(plain.weight_hh_l0, before["original" if kind == "custom" else "original1"]) > 0.1
    assert_all_close(forward_and_grads(ours, x)[:4], forward_and_grads(plain, x)[:4], 1e-5)

    # Gradients reach the originals, like nn.LSTM's.
    assert_all_close(forward_and_grads(ours, x), forward_and_grads(ref, x), 1e-5)

    # Training: the originals change, the loss falls, and the trajectory is nn.LSTM's.
    losses = sgd_steps(ours, x.detach(), steps=4, lr=0.05)
    ref_losses = sgd_steps(ref, x.detach(), steps=4, lr=0.05)
    assert losses[-1] < losses[0]
    assert all(not torch.equal(before[k], v.detach()) for k, v in originals.items())
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-5 * abs(b)
    for (name, p), (name_r, p_r) in zip(ours.named_parameters(), ref.named_parameters()):
        assert name == name_r and rel_error(p, p_r) <= 1e-5, name


def test_tied_weights_within_one_module_get_summed_gradient():
    kw = dict(input_size=4, hidden_size=4, num_layers=2)
    ref, ours = pair(**kw)
    untied = copy.deepcopy(ours)
    with torch.no_grad():
        untied.weight_hh_l1.copy_(untied.weight_hh_l0)
    for m in (ref, ours):
        m.weight_hh_l1 = m.weight_hh_l0  # tie after construction
    assert ours.weight_hh_l1 is ours.weight_hh_l0
    assert ours._flat_weights[ours._flat_weights_names.index("weight_hh_l1")] is ours.weight_hh_l0
    assert len(list(ours.parameters())) == len(list(ref.parameters())) == 7
    x = torch.randn(5, 2, 4, requires_grad=True)
    assert_all_close(forward_and_grads(ours, x), forward_and_grads(ref, x), 1e-5)
    # Independently: the tied gradient is the sum of the two untied gradients.
    out, (h, c) = ours(x)
    (g_tied,) = torch.autograd.grad(weighted_loss(out, h, c), [ours.weight_hh_l0])
    out, (h, c) = untied(x)
    g0, g1 = torch.autograd.grad(weighted_loss(out, h, c), [untied.weight_hh_l0, untied.weight_hh_l1])
    assert rel_error(g_tied, g0 + g1) <= 1e-5


def test_weight_shared_between_two_modules_gets_summed_gradient():
    kw = dict(input_size=4, hidden_size=4)
    (r1, o1), (r2, o2) = pair(**kw), pair(**kw)
    r2.weight_hh_l0, o2.weight_hh_l0 = r1.weight_hh_l0, o1.weight_hh_l0
    x = torch.randn(5, 2, 4)

    def run(first, second):
        out, (h, c) = second(first(x)[0])
        shared = first.weight_hh_l0
        return [out, *torch.autograd.grad(weighted_loss(out, h, c), [shared, first.weight_ih_l0, second.weight_ih_l0])]

    assert_all_close(run(o1, o2), run(r1, r2), 1e-5)
