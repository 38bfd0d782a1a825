"""pipelstm.LSTMCell wherever nn.LSTMCell is used: the same state_dict, repr,
outputs and gradients (batched or not, with or without hx and bias), and
under torch.compile with fullgraph. (The fused cell op: test_cell_op.py;
rejected inputs: test_module_bad_input.py.)

The reference is always independent of pipelstm: nn.LSTMCell holding the same
weights (load_state_dict), or the same module run eagerly.
"""

import pytest
import torch
from torch import nn

import pipelstm
from lstm_pairs import assert_all_close, weighted_loss


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_matches_nn_lstm_cell(batched, with_hx, bias):
    ref = nn.LSTMCell(3, 5, bias=bias)
    ours = pipelstm.LSTMCell(3, 5, bias=bias)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref2 = nn.LSTMCell(3, 5, bias=bias)
    ref2.load_state_dict(ours.state_dict(), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(ref2.state_dict().values(), ref.state_dict().values()))
    shape = (2,) if batched else ()
    x = torch.randn(*shape, 3, requires_grad=True)
    hx = (torch.randn(*shape, 5, requires_grad=True), torch.randn(*shape, 5, requires_grad=True)) if with_hx else None

    def run(cell):
        h, c = cell(x, hx)
        leaves = [x, *(hx or ()), *cell.parameters()]
        return [h, c, *torch.autograd.grad(weighted_loss(h, c, h[..., :0]), leaves)]

    assert_all_close(run(ours), run(ref), 1e-5)
    assert repr(ours) == repr(ref)


@pytest.mark.parametrize("with_hx", [False, True])
def test_cell_compiles_fullgraph(with_hx):
    ref = nn.LSTMCell(3, 5)
    cell = pipelstm.LSTMCell(3, 5)
    cell.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, requires_grad=True)
    hx = (torch.randn(2, 5, requires_grad=True), torch.randn(2, 5, requires_grad=True)) if with_hx else None
    compiled = torch.compile(cell, fullgraph=True, backend="aot_eager")

    def run(c):
        h, cy = c(x, hx)
        return [h, cy, *torch.autograd.grad(weighted_loss(h, cy, h[:, :0]), [x, *(hx or ()), *cell.parameters()])]

    assert_all_close(run(compiled), run(cell), 1e-6)
    ref_out = ref(x, hx)
    assert_all_close(run(compiled)[:2], list(ref_out), 1e-5)


# (input shape, h shape, c shape): unbatched input with batched states and
# the reverse, mixed state dimensions, wrong sizes: each is refused as
# nn.LSTMCell refuses it, with its exception type and message.
BAD_SHAPES = [
    ((3,), (2, 4), (2, 4)),
    ((3,), (1, 4), (1, 4)),
    ((3,), (4,), (1, 4)),
    ((3,), (1, 4), (4,)),
    ((3,), (1, 1, 4), (1, 1, 4)),
    ((2, 3), (4,), (4,)),
    ((2, 3), (2, 1, 4), (2, 1, 4)),
    ((1, 3), (1, 4), (4,)),
    ((1, 3), (4,), (1, 4)),
    ((2, 5), (2, 4), (2, 4)),
    ((2, 3), (2, 5), (2, 4)),
    ((2, 1, 3), (2, 4), (2, 4)),
]


@pytest.mark.parametrize("x_shape, h_shape, c_shape", BAD_SHAPES)
def test_bad_shapes_fail_as_in_nn_lstm_cell(x_shape, h_shape, c_shape):
    args = (torch.randn(*x_shape), (torch.randn(*h_shape), torch.randn(*c_shape)))
    with pytest.raises(Exception) as want:
        nn.LSTMCell(3, 4)(*args)
    with pytest.raises(type(want.value)) as got:
        pipelstm.LSTMCell(3, 4)(*args)
    assert str(got.value) == str(want.value)
