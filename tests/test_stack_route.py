"""python/pipelstm/stack/route.py: which way a call runs its stack, decided
in one place from the call's facts and pipelstm.backends.cuda's switches.
The decision needs no GPU: CPU tensors are taken for CUDA ones."""

import pytest
import torch

from pipelstm.stack import route as route_module
from pipelstm.backends import cuda as cuda_switches
from pipelstm.stack.route import StackRoute, stack_route

LAYERS = StackRoute("layers")


@pytest.fixture
def as_cuda(monkeypatch):
    monkeypatch.setattr(route_module, "_is_cuda", lambda t: True)


@pytest.mark.parametrize("switches, layers, bidirectional, T, want", [
    (dict(), 4, False, 60, LAYERS),
    (dict(stack_graph=8), 4, False, 60, StackRoute("stack_graph", 8)),
    (dict(stack_graph=8), 4, False, 5, StackRoute("stack_graph", 5)),  # at most T chunks
    (dict(stack_graph=8), 4, False, 1, StackRoute("stack_graph", 0)),  # one chunk: layer after layer
    (dict(stack_graph=1), 4, False, 60, StackRoute("stack_graph", 0)),
    (dict(stack_graph=8), 4, True, 60, StackRoute("stack_graph", 0)),  # no wavefront both ways
    (dict(stack_graph=8), 1, False, 60, StackRoute("stack_graph", 0)),
    (dict(layer_wavefront=4), 4, False, 60, StackRoute("wavefront", 4)),
    (dict(layer_wavefront=64), 4, False, 10, StackRoute("wavefront", 10)),  # at most T chunks
    (dict(layer_wavefront=4), 4, True, 60, LAYERS),
    (dict(layer_wavefront=4), 1, False, 60, LAYERS),
    (dict(layer_wavefront=4), 4, False, 1, LAYERS),
    (dict(layer_wavefront=4, stack_graph=2), 4, False, 60, StackRoute("stack_graph", 2)),  # the graph first
])
def test_the_switches_pick_the_route(as_cuda, switches, layers, bidirectional, T, want):
    with cuda_switches.flags(**switches):
        got = stack_route(torch.zeros(T, 2, 3), layers, bidirectional, packed=False)
    assert (got.kind, got.chunks) == (want.kind, want.chunks)


def test_a_stack_graph_route_carries_the_kernel_switches_its_capture_records(as_cuda):
    x = torch.zeros(60, 2, 3)
    with cuda_switches.flags(stack_graph=8):
        assert stack_route(x, 4, False, packed=False).kernels == (None, "grid")
        with cuda_switches.flags(persistent=True, persistent_kernel="cluster"):
            assert stack_route(x, 4, False, packed=False).kernels == (True, "cluster")


def test_what_keeps_the_layers_one_after_another(as_cuda):
    x = torch.zeros(60, 2, 3)
    with cuda_switches.flags(stack_graph=8, layer_wavefront=4):
        assert stack_route(x, 4, False, packed=True) == LAYERS
        assert stack_route(x, 4, False, packed=False, layer_by_layer=True) == LAYERS
        with torch.no_grad():  # not a training call: no stack graph
            assert stack_route(x, 4, False, packed=False) == StackRoute("wavefront", 4)
        with torch.autocast("cpu"):  # autocast (on the input's device): no stack graph
            assert stack_route(x, 4, False, packed=False) == StackRoute("wavefront", 4)


def test_a_cpu_input_runs_its_layers_one_after_another():
    with cuda_switches.flags(stack_graph=8, layer_wavefront=4):
        assert stack_route(torch.zeros(60, 2, 3), 4, False, packed=False) == LAYERS
