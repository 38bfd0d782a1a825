"""pipelstm.LSTM under torch.compile (aot_eager with fullgraph, inductor) and
torch.export (static and dynamic shapes). (LSTMCell under torch.compile:
test_cell_module.py.)

The reference is always independent of pipelstm: nn.LSTM holding the same
weights (load_state_dict), or the same module run eagerly.
"""

import pytest
import torch

from lstm_pairs import assert_all_close, forward_and_grads, make_hx, pair
from reference import rel_error


@pytest.mark.parametrize("with_hx", [False, True])
def test_compile_aot_eager_fullgraph_matches_eager_and_nn_lstm(with_hx):
    ref, ours = pair()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")  # fullgraph: any graph break raises
    shapes = [(5, 2)] if with_hx else [(5, 2), (7, 3)]  # a second shape: recompiled with dynamic sizes
    for T, B in shapes:
        x = torch.randn(T, B, 4, requires_grad=True)
        hx = make_hx(ours, B) if with_hx else None
        got = forward_and_grads(compiled, x, hx)
        assert_all_close(got, forward_and_grads(ours, x, hx), 1e-6)
        assert_all_close(got, forward_and_grads(ref, x, hx), 1e-5)


def test_compile_inductor_matches_eager():
    # Default backend on a tiny model: forward and backward through generated code.
    ref, ours = pair(input_size=3, hidden_size=4, bidirectional=True, proj_size=2)
    x = torch.randn(4, 2, 3, requires_grad=True)
    got = forward_and_grads(torch.compile(ours, fullgraph=True), x)
    assert_all_close(got, forward_and_grads(ours, x), 1e-6)
    assert_all_close(got, forward_and_grads(ref, x), 1e-5)


@pytest.mark.parametrize("with_hx", [False, True])
def test_export_matches_eager(with_hx):
    ref, ours = pair()
    x = torch.randn(5, 2, 4)
    hx = tuple(t.detach() for t in make_hx(ours, 2)) if with_hx else None
    args = (x, hx) if with_hx else (x,)
    program = torch.export.export(ours, args)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "pipelstm.lstm_layer_forward.default" in targets
    got = program.module()(*args)
    out, (h, c) = ours(*args)
    out_r, (h_r, c_r) = ref(*args)
    assert_all_close([got[0], *got[1]], [out, h, c], 1e-6)
    assert_all_close([got[0], *got[1]], [out_r, h_r, c_r], 1e-5)


def test_export_with_dynamic_sequence_and_batch():
    ref, ours = pair()
    T, B = torch.export.Dim("T", min=2, max=64), torch.export.Dim("B", min=2, max=64)
    program = torch.export.export(ours, (torch.randn(5, 2, 4),), dynamic_shapes=({0: T, 1: B},))
    x = torch.randn(9, 3, 4)
    assert rel_error(program.module()(x)[0], ref(x)[0]) <= 1e-5


def _ops_in_compiled_graph(module, *args):
    """The pipelstm ops TorchDynamo puts in the graph of module(*args)."""
    seen = set()

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "pipelstm" in str(n.target))
        return gm.forward

    torch.compile(module, backend=backend, fullgraph=True)(*args)
    return seen


def test_compiled_module_runs_the_fused_op_and_a_compiled_transform_the_composition():
    # The composition (an ATen step loop) is for torch.func transforms only;
    # a plain compiled model must keep the fused kernels.
    _, ours = pair()
    x = torch.randn(5, 2, 4)
    assert _ops_in_compiled_graph(ours, x) == {"pipelstm.lstm_layer_forward"}
    per_sample = torch.func.vmap(lambda xi: ours(xi.unsqueeze(1))[0].sum(), in_dims=1)
    assert _ops_in_compiled_graph(per_sample, x) == {"pipelstm.lstm_layer_composite"}
