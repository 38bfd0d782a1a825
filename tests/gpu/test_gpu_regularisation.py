"""weight_dropout and variational dropout on CUDA, in float64, against the
same step-by-step reference as on the CPU (tests/test_regularisation.py),
with the masks pipelstm drew; and in float32 with graphs and the stack
graph switched on, which these options bypass."""

import pytest
import torch

import pipelstm
from pipelstm.backends import cuda as cuda_switches
from test_regularisation import I, H, recorded, ref_stack  # noqa: F401  (recorded: the fixture)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_the_reference_on_cuda(recorded, bidirectional):  # noqa: F811
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(I, H, num_layers=2, bidirectional=bidirectional, dropout=0.4, weight_dropout=0.3,
                         dropout_mode="variational").cuda().double()
    D, T, B = (2 if bidirectional else 1), 6, 3
    x = torch.randn(T, B, I, dtype=torch.float64, device="cuda", requires_grad=True)
    h0 = torch.randn(2 * D, B, H, dtype=torch.float64, device="cuda")
    c0 = torch.randn(2 * D, B, H, dtype=torch.float64, device="cuda")
    out, (h, c) = lstm(x, (h0, c0))
    want = ref_stack(lstm, x, h0, c0, recorded["weight"], recorded["sequence"])
    got_g = torch.autograd.grad(out.sum() + h.sum(), [x, *lstm.parameters()])
    want_g = torch.autograd.grad(want[0].sum() + want[1].sum(), [x, *lstm.parameters()])
    for a, b in zip((out, h, c, *got_g), (*want, *want_g)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_runs_under_graphs_and_the_stack_graph():
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(64, 64, num_layers=3, dropout=0.3, weight_dropout=0.3, dropout_mode="variational").cuda()
    x = torch.randn(20, 4, 64, device="cuda")
    with cuda_switches.flags(graphs=True, stack_graph=4):
        for _ in range(3):  # would be eager, captured, replayed without the options
            out, _ = lstm(x)
            out.sum().backward()
    assert torch.isfinite(lstm.weight_hh_l0.grad).all()
    lstm.eval()
    ref = torch.nn.LSTM(64, 64, num_layers=3).cuda().eval()
    ref.load_state_dict(lstm.state_dict())
    with torch.backends.cudnn.flags(allow_tf32=False):
        torch.testing.assert_close(lstm(x)[0], ref(x)[0], rtol=1e-5, atol=1e-5)
