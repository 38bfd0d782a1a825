"""pipelstm.LSTM's dtype, device and construction: .to / .double moves,
construction on the meta device then materialised, CPU autocast to bfloat16.
(Reduced-precision numerics: test_module_numerics.py; stages on several
devices: test_lstm_devices.py.)

The reference is always independent of pipelstm: nn.LSTM holding the same
weights (load_state_dict), or the same module run eagerly.
"""

import pytest
import torch
from torch import nn

import pipelstm
from lstm_pairs import KW, assert_all_close, forward_and_grads, make_hx, pair, weighted_loss


@pytest.mark.parametrize("move", ["to", "double"])
def test_moves_to_float64(move):
    ref, ours = pair()
    ref, ours = ((m.to(torch.float64) if move == "to" else m.double()) for m in (ref, ours))
    assert all(p.dtype == torch.float64 for p in ours.parameters())
    assert all(w.dtype == torch.float64 for w in ours._flat_weights)
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    hx = make_hx(ours, 2, torch.float64)
    assert_all_close(forward_and_grads(ours, x, hx), forward_and_grads(ref, x, hx), 1e-10)


def test_meta_construction_then_materialise():
    ours = pipelstm.LSTM(**KW, device="meta")
    ref = nn.LSTM(**KW)
    assert all(p.is_meta for p in ours.parameters())
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    ours.to_empty(device="cpu")
    assert all(p.device.type == "cpu" for p in ours.parameters())
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(5, 2, 4, requires_grad=True)
    assert_all_close(forward_and_grads(ours, x), forward_and_grads(ref, x), 1e-5)


def test_autocast_bfloat16_cpu_forward_and_backward():
    ref, ours = pair()
    lin = nn.Linear(4, 4)
    x = torch.randn(5, 2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (h, c) = ours(lin(x))
    loss = weighted_loss(out.float(), h.float(), c.float())
    got = [out, h, c, *torch.autograd.grad(loss, [lin.weight, lin.bias, *ours.parameters()])]
    # fp32 nn.LSTM without autocast, same Linear.
    out, (h, c) = ref(lin(x))
    expected = [out, h, c, *torch.autograd.grad(weighted_loss(out, h, c), [lin.weight, lin.bias, *ref.parameters()])]
    assert all(torch.isfinite(t).all() for t in got)
    assert_all_close(got, expected, 1e-2)
