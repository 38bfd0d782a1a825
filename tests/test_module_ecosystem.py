"""pipelstm.LSTM / LSTMCell wherever nn.LSTM / nn.LSTMCell are used: compile,
export, functional_call, parametrizations, tied weights, dtype moves, meta
construction, autocast, serialisation, DDP."""

import copy
import io

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parametrize

import pipelstm
from reference import rel_error

KW = dict(input_size=4, hidden_size=6, num_layers=2, bidirectional=True, proj_size=3)


def pair(dtype=torch.float32, **kw):
    kw = kw or KW
    ref = nn.LSTM(**kw).to(dtype)
    ours = pipelstm.LSTM(**kw).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def grads(model, out):
    return torch.autograd.grad(out.sum(), list(model.parameters()))


# --- torch.compile / export -----------------------------------------------------


@pytest.mark.parametrize("with_hx", [False, True])
def test_compile_fullgraph_matches_eager(with_hx):
    _, ours = pair()
    x = torch.randn(5, 2, 4)
    hx = (torch.randn(4, 2, 3), torch.randn(4, 2, 6)) if with_hx else None
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    out_e, (h_e, c_e) = ours(x, hx)
    out_c, (h_c, c_c) = compiled(x, hx)
    for a, b in [(out_c, out_e), (h_c, h_e), (c_c, c_e)]:
        torch.testing.assert_close(a, b)
    for a, b in zip(grads(ours, out_e + 0), grads(ours, out_c + 0)):
        torch.testing.assert_close(a, b)


def test_compile_inductor_matches_eager():
    _, ours = pair(input_size=3, hidden_size=4, num_layers=1)
    x = torch.randn(4, 2, 3)
    out_c = torch.compile(ours, fullgraph=True)(x)[0]
    torch.testing.assert_close(out_c, ours(x)[0])


def test_export_matches_eager():
    _, ours = pair()
    x = torch.randn(5, 2, 4)
    program = torch.export.export(ours, (x,))
    torch.testing.assert_close(program.module()(x)[0], ours(x)[0])


# --- parameter replacement --------------------------------------------------------


def test_functional_call_with_swapped_parameters():
    ref, ours = pair()
    other = {k: torch.randn_like(v) for k, v in ours.state_dict().items()}
    x = torch.randn(5, 2, 4)
    out = torch.func.functional_call(ours, other, (x,))[0]
    ref.load_state_dict(other)
    torch.testing.assert_close(out, ref(x)[0])


class _Scale(nn.Module):
    def forward(self, w):
        return 2.0 * w


def test_parametrization_is_used_and_trains():
    ref, ours = pair()
    parametrize.register_parametrization(ours, "weight_hh_l0", _Scale())
    with torch.no_grad():
        ref.weight_hh_l0.mul_(2.0)
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(ours(x)[0], ref(x)[0])
    original = ours.parametrizations.weight_hh_l0.original
    before = original.detach().clone()
    torch.optim.SGD(ours.parameters(), lr=0.1).zero_grad()
    ours(x)[0].sum().backward()
    assert original.grad is not None and original.grad.abs().sum() > 0
    torch.optim.SGD([original], lr=0.1).step()
    assert not torch.equal(before, original.detach())


def test_weight_norm_trains_like_nn_lstm():
    ref, ours = pair()
    ref = torch.nn.utils.parametrizations.weight_norm(ref, "weight_hh_l0")
    ours = torch.nn.utils.parametrizations.weight_norm(ours, "weight_hh_l0")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(ours(x)[0], ref(x)[0])
    g_ref = grads(ref, ref(x)[0])
    g_ours = grads(ours, ours(x)[0])
    for a, b in zip(g_ours, g_ref):
        assert rel_error(a, b) <= 1e-5


def test_tied_weights_get_summed_gradient():
    kw = dict(input_size=4, hidden_size=4, num_layers=2)
    ref, ours = pair(**kw)
    for m in (ref, ours):
        m.weight_hh_l1 = m.weight_hh_l0
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(ours(x)[0], ref(x)[0])
    (g_ours,) = torch.autograd.grad(ours(x)[0].sum(), [ours.weight_hh_l0])
    (g_ref,) = torch.autograd.grad(ref(x)[0].sum(), [ref.weight_hh_l0])
    assert rel_error(g_ours, g_ref) <= 1e-5


# --- dtype, device, construction ----------------------------------------------------


@pytest.mark.parametrize("move", ["to", "double"])
def test_moves_to_float64(move):
    ref, ours = pair()
    ref, ours = (m.to(torch.float64) if move == "to" else m.double() for m in (ref, ours))
    assert all(p.dtype == torch.float64 for p in ours.parameters())
    x = torch.randn(5, 2, 4, dtype=torch.float64)
    assert rel_error(ours(x)[0], ref(x)[0]) <= 1e-10


def test_meta_construction_then_materialise():
    ours = pipelstm.LSTM(**KW, device="meta")
    ref = nn.LSTM(**KW)
    assert all(p.is_meta for p in ours.parameters())
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    ours.to_empty(device="cpu")
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(ours(x)[0], ref(x)[0])


def test_autocast_bfloat16_cpu():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    ref, ours = pair()
    x = torch.randn(5, 2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(lin(x))[0]
    out.float().sum().backward()
    assert ours.weight_ih_l0.grad is not None
    expected = ref(lin(x))[0]
    assert rel_error(out, expected) <= 1e-2


# --- serialisation, structure -------------------------------------------------------


def test_save_load_whole_module_and_state_dict():
    _, ours = pair()
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh = pipelstm.LSTM(**KW)
    fresh.load_state_dict(state)
    x = torch.randn(5, 2, 4)
    for m in (loaded, fresh, copy.deepcopy(ours)):
        assert torch.equal(m(x)[0], ours(x)[0])


def test_state_dict_both_ways_and_structure():
    ref = nn.LSTM(**KW)
    ours = pipelstm.LSTM(**KW)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert repr(ours) == repr(ref)
    assert ours._flat_weights_names == ref._flat_weights_names
    assert [[tuple(w.shape) for w in ws] for ws in ours.all_weights] == [[tuple(w.shape) for w in ws] for ws in ref.all_weights]
    assert all(a is b for a, b in zip(ours._flat_weights, ours.parameters()))
    ours.flatten_parameters()
    assert isinstance(ours, nn.RNNBase) and not isinstance(ours, nn.LSTM)


def test_ddp_single_process_gloo(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ref, ours = pair()
        ddp = nn.parallel.DistributedDataParallel(ours)
        x = torch.randn(5, 2, 4)
        ddp(x)[0].sum().backward()
        g_ref = grads(ref, ref(x)[0])
        for p, g in zip(ours.parameters(), g_ref):
            assert rel_error(p.grad, g) <= 1e-5
    finally:
        dist.destroy_process_group()


# --- LSTMCell ------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_matches_nn_lstm_cell(batched, with_hx, bias):
    ref = nn.LSTMCell(3, 5, bias=bias)
    ours = pipelstm.LSTMCell(3, 5, bias=bias)
    ours.load_state_dict(ref.state_dict(), strict=True)
    ref.load_state_dict(ours.state_dict(), strict=True)
    shape = (2,) if batched else ()
    x = torch.randn(*shape, 3, requires_grad=True)
    hx = (torch.randn(*shape, 5), torch.randn(*shape, 5)) if with_hx else None
    h_r, c_r = ref(x, hx)
    h_o, c_o = ours(x, hx)
    torch.testing.assert_close(h_o, h_r)
    torch.testing.assert_close(c_o, c_r)
    leaves = [x, *ref.parameters()]
    g_r = torch.autograd.grad((h_r + c_r).sum(), leaves)
    g_o = torch.autograd.grad((h_o + c_o).sum(), [x, *ours.parameters()])
    for a, b in zip(g_o, g_r):
        assert rel_error(a, b) <= 1e-5
    assert repr(ours) == repr(ref)


def test_cell_compiles_fullgraph():
    cell = pipelstm.LSTMCell(3, 5)
    x = torch.randn(2, 3)
    out = torch.compile(cell, fullgraph=True, backend="aot_eager")(x)
    torch.testing.assert_close(out[0], cell(x)[0])


# --- double backward -----------------------------------------------------------------


def test_double_backward_raises_a_clear_error():
    _, ours = pair(torch.float64)
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(ours(x)[0].sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        g.sum().backward()


def test_gradgradcheck_raises_rather_than_passing_wrong_values():
    x = torch.randn(3, 1, 2, dtype=torch.float64, requires_grad=True)
    m = pipelstm.LSTM(2, 2).double()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.gradgradcheck(lambda x: m(x)[0], (x,))
