"""pipelstm.geometry.LayerGeometry: one LSTM layer's sizes and workspace
layout, read off its weights, equal to what the C++ op allocates."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from pipelstm.geometry import LayerGeometry

I, H, B, T = 3, 5, 2, 4


def weights(P=0):
    w_ih, w_hh = torch.randn(4 * H, I), torch.randn(4 * H, P or H)
    w_hr = torch.randn(P, H) if P else None
    return w_ih, w_hh, w_hr


@pytest.mark.parametrize("P", [0, 2])
def test_sizes_from_the_weights(P):
    w_ih, _, w_hr = weights(P)
    g = LayerGeometry.of(w_ih, w_hr)
    assert (g.input_size, g.hidden_size, g.proj_size) == (I, H, P)
    assert g.projected == (P > 0)
    assert g.out_size == (P or H)
    assert g.workspace_width == (6 if P else 5) * H
    assert g.workspace_numel(T * B) == T * B * g.workspace_width
    assert g == LayerGeometry(I, H, P)


@pytest.mark.parametrize("P", [0, 2])
@pytest.mark.parametrize("fake", [False, True], ids=["op", "fake_kernel"])
def test_the_op_and_its_fake_kernel_allocate_that_geometry(P, fake):
    w_ih, w_hh, w_hr = weights(P)
    g = LayerGeometry.of(w_ih, w_hr)
    args = (torch.randn(T, B, I), torch.zeros(B, g.out_size), torch.zeros(B, H), w_ih, w_hh, None, None, w_hr)
    if fake:
        with FakeTensorMode() as mode:
            args = tuple(None if a is None else mode.from_tensor(a) for a in args)
            out, h_n, c_n, workspace = torch.ops.pipelstm.lstm_layer_forward(*args, False)
    else:
        out, h_n, c_n, workspace = torch.ops.pipelstm.lstm_layer_forward(*args, False)
    assert tuple(out.shape) == (T, B, g.out_size)
    assert tuple(h_n.shape) == (B, g.out_size) and tuple(c_n.shape) == (B, g.hidden_size)
    assert tuple(workspace.shape) == (g.workspace_numel(T * B),)


def test_frozen():
    with pytest.raises(AttributeError):
        LayerGeometry(I, H).hidden_size = 7
