"""The fused ops' autograd formulas (csrc/lstm_autograd.cpp,
csrc/layernorm_autograd.cpp): registered in C++ under the Autograd key, a
call that needs no graph records none, a backward op that someone
differentiates raises instead of giving zeros, and a create_graph=True
backward (the composition differentiated) gives the fused formula's first
derivative.
(Their gradients against nn.LSTM and float64 references are checked with the
ops and modules: test_layer_op.py, test_cell_op.py, test_module_transforms.py.)"""

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import pipelstm  # noqa: F401

ops = torch.ops.pipelstm
F64 = torch.float64
FORWARD_OPS = ["lstm_cell_forward", "lstm_layer_forward", "lstm_packed_layer_forward", "lstm_zoneout_layer_forward",
               "lstm_layernorm_layer_forward"]


def _layer_args(requires_grad):
    T, B, I, H = 3, 2, 4, 5
    g = torch.Generator().manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, dtype=F64, generator=g).requires_grad_(requires_grad)

    return [rnd(T, B, I), rnd(B, H), rnd(B, H), rnd(4 * H, I), rnd(4 * H, H), rnd(4 * H), rnd(4 * H), None]


@pytest.mark.parametrize("name", FORWARD_OPS)
def test_the_formula_is_a_cpp_kernel_under_the_autograd_key(name):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"pipelstm::{name}", "Autograd")


def test_the_graph_node_is_the_cpp_formula():
    output, *_ = ops.lstm_layer_forward(*_layer_args(True), False)
    assert "CppNode" in output.grad_fn.name() and "LayerFunction" in output.grad_fn.name()


@pytest.mark.parametrize("grad_mode", [True, False], ids=["inputs_without_grad", "no_grad"])
def test_a_call_that_needs_no_graph_records_none(grad_mode):
    args = _layer_args(requires_grad=not grad_mode)
    with torch.set_grad_enabled(grad_mode):
        outputs = ops.lstm_layer_forward(*args, False)
    assert all(t.grad_fn is None and not t.requires_grad for t in outputs)


def test_the_workspace_is_not_differentiated():
    output, h_n, c_n, workspace = ops.lstm_layer_forward(*_layer_args(True), False)
    assert output.requires_grad and h_n.requires_grad and c_n.requires_grad
    assert not workspace.requires_grad


def test_differentiating_a_layer_backward_op_raises_not_zeros():
    args = _layer_args(False)
    output, h_n, c_n, workspace = ops.lstm_layer_forward(*args, False)
    grad_output = torch.randn_like(output, requires_grad=True)
    x, h0, c0, w_ih, w_hh, _, _, w_hr = args
    grads = ops.lstm_layer_backward(grad_output, None, None, x, h0, c0, w_ih, w_hh, w_hr, output, workspace, False)
    with pytest.raises(RuntimeError, match="lstm_layer_backward.*not implemented"):
        torch.autograd.grad(grads[0].sum(), grad_output)


def test_differentiating_a_cell_backward_op_raises_not_zeros():
    g = torch.Generator().manual_seed(0)
    gates_i, gates_h = (torch.randn(2, 12, dtype=F64, generator=g) for _ in range(2))
    cx = torch.randn(2, 3, dtype=F64, generator=g)
    hy, cy, workspace = ops.lstm_cell_forward(gates_i, gates_h, cx, None, None)
    grad_hy = torch.randn_like(hy, requires_grad=True)
    grad_gates, _ = ops.lstm_cell_backward(grad_hy, None, cx, cy, workspace)
    with pytest.raises(RuntimeError, match="lstm_cell_backward.*not implemented"):
        torch.autograd.grad(grad_gates.sum(), grad_hy)


def _module_grads(run, lstm, x):
    """The gradients of the input and every parameter (by .backward(), which
    reentrant checkpointing needs)."""
    tensors = [x, *lstm.parameters()]
    for t in tensors:
        t.grad = None
    run(x)[0].pow(2).sum().backward()
    return [t.grad for t in tensors]


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_gives_the_plain_gradients(use_reentrant):
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(4, 5, num_layers=2, bidirectional=True, dtype=F64)
    x = torch.randn(3, 2, 4, dtype=F64, requires_grad=True)
    want = _module_grads(lstm, lstm, x)
    got = _module_grads(lambda x: torch.utils.checkpoint.checkpoint(lstm, x, use_reentrant=use_reentrant), lstm, x)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_saved_tensor_hooks_pack_and_unpack_what_the_formulas_save():
    torch.manual_seed(0)
    lstm = pipelstm.LSTM(4, 5, num_layers=2, dtype=F64)
    x = torch.randn(3, 2, 4, dtype=F64, requires_grad=True)
    want = _module_grads(lstm, lstm, x)
    packed = []

    def pack(t):
        packed.append(t)
        return t.clone()  # the backward must read the unpacked copies

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got = _module_grads(lstm, lstm, x)
    # per layer: input, h0, c0, w_ih, w_hh, output, workspace, b_ih, b_hh
    assert sum(t.shape == lstm.weight_hh_l0.shape for t in packed) >= 2 and len(packed) >= 18
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_compiled_autograd_gives_the_eager_gradients():
    from torch._dynamo import compiled_autograd

    torch.manual_seed(0)
    lstm = pipelstm.LSTM(4, 5, num_layers=2, dtype=F64)
    cell = pipelstm.LSTMCell(4, 5, dtype=F64)
    x = torch.randn(3, 2, 4, dtype=F64, requires_grad=True)
    tensors = [x, *lstm.parameters(), *cell.parameters()]

    def grads():
        for t in tensors:
            t.grad = None
        (lstm(x)[0].pow(2).sum() + cell(x[0])[0].sum()).backward()
        return [t.grad for t in tensors]

    want = grads()
    with compiled_autograd._enable(torch.compile(backend="eager")):
        got = grads()
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _models():
    torch.manual_seed(0)
    yield "lstm_proj_bidirectional", pipelstm.LSTM(4, 5, num_layers=2, bidirectional=True, proj_size=3, dtype=F64)
    yield "lstm_packed", pipelstm.LSTM(4, 5, num_layers=2, dtype=F64)
    yield "zoneout", pipelstm.LSTM(4, 5, num_layers=2, zoneout=(0.3, 0.2), dtype=F64).eval()
    yield "layernorm_zoneout", pipelstm.LayerNormLSTM(4, 5, num_layers=2, zoneout=0.2, dtype=F64).eval()
    yield "cell", pipelstm.LSTMCell(4, 5, dtype=F64)


@pytest.mark.parametrize("name, model", list(_models()), ids=lambda v: v if isinstance(v, str) else "")
def test_create_graph_gives_the_fused_formulas_first_derivative(name, model):
    # The create_graph=True backward differentiates the composition: its
    # gradients of every input (initial states distinct, so a swap shows)
    # must be the fused formula's.
    torch.manual_seed(1)
    x = torch.randn(3, 2, 4, dtype=F64, requires_grad=True)
    if name == "cell":
        hx = tuple(torch.randn(2, 5, dtype=F64, requires_grad=True) for _ in range(2))
        run = lambda: model(x[0], hx)  # noqa: E731
    else:
        D = 2 if model.bidirectional else 1
        P = model.proj_size or model.hidden_size
        hx = (torch.randn(2 * D, 2, P, dtype=F64, requires_grad=True),
              torch.randn(2 * D, 2, 5, dtype=F64, requires_grad=True))
        inp = pack_padded_sequence(x, torch.tensor([3, 2])) if name == "lstm_packed" else x
        run = lambda: model(inp, hx)  # noqa: E731
    tensors = [x, *hx, *model.parameters()]

    def first_derivative(create_graph):
        out = run()
        out, (h, c) = (out[0], out) if name == "cell" else out
        data = out.data if name == "lstm_packed" else out
        loss = data.pow(2).sum() + h.pow(3).sum() + 2 * c.sum()
        return torch.autograd.grad(loss, tensors, create_graph=create_graph, allow_unused=True)

    for got, want in zip(first_derivative(True), first_derivative(False)):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
