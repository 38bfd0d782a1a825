"""pipelstm.stack.graph: a stack's training call captured as one graph each way.

Capturing needs a GPU (tests/gpu/test_gpu_stack_graph.py). Here a CPU
stand-in records what a capture records and replays as a graph does: a
replay recomputes into the captured buffers, overwriting them. Through it,
every replay must give what the layers give without graphs (float64,
values and gradients), and the guards must hold: copies handed out, a
call made while an earlier call's backward is still to come runs eagerly,
a backward whose buffers were replayed over raises.
"""

from types import SimpleNamespace

import pytest
import torch

import pipelstm
from pipelstm.stack import graph as stack_graph, route as stack_route
from pipelstm.backends import cuda
from stack_graph_cases import check_two_calls_before_one_backward

I, H, LAYERS, T, B = 5, 7, 3, 9, 4


def stand_in_capture(entry, body, inputs, params):
    """capture_cuda's records on the CPU: the body run once into buffers of
    the entry's own; a replay runs it again into the same buffers."""
    targets = entry.prepare(inputs, params)
    live = {}

    def forward():
        with torch.enable_grad():
            live["outputs"] = body(*entry.inputs, *params)
        for mine, o in zip(entry.outputs, live["outputs"]):
            mine.copy_(o.detach())

    def backward():
        grads = torch.autograd.grad(live["outputs"], targets, entry.grad_outputs, allow_unused=True,
                                    retain_graph=True)
        for mine, g in zip(entry.grads, grads):
            if mine is not None:
                mine.copy_(g)

    with torch.enable_grad():
        live["outputs"] = body(*entry.inputs, *params)
    entry.outputs = [o.detach().clone() for o in live["outputs"]]
    entry.grad_outputs = [torch.zeros_like(o) for o in entry.outputs]
    grads = torch.autograd.grad(live["outputs"], targets, entry.grad_outputs, allow_unused=True, retain_graph=True)
    entry.grads = [None if g is None else torch.zeros_like(g) for g in grads]
    entry.forward, entry.backward = SimpleNamespace(replay=forward), SimpleNamespace(replay=backward)


@pytest.fixture
def graphs(monkeypatch):
    """This process's stack graphs through the stand-in, with CPU tensors
    taken for CUDA ones."""
    g = stack_graph.StackGraphs(stand_in_capture)
    monkeypatch.setattr(stack_graph, "_graphs", g)
    monkeypatch.setattr(stack_route, "_is_cuda", lambda t: True)
    return g


def _models(bidirectional=False, layers=LAYERS):
    torch.manual_seed(0)
    a = pipelstm.LSTM(I, H, num_layers=layers, bidirectional=bidirectional, dtype=torch.float64)
    b = pipelstm.LSTM(I, H, num_layers=layers, bidirectional=bidirectional, dtype=torch.float64)
    b.load_state_dict(a.state_dict())
    return a, b


def _inputs(seed, layers=LAYERS, directions=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, I, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * directions, B, H, generator=g, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(layers * directions, B, H, generator=g, dtype=torch.float64, requires_grad=True)
    return x, h0, c0


def _step(model, x, h0, c0):
    """Values and every gradient of one call (weights' accumulated)."""
    x, h0, c0 = (t.detach().requires_grad_() for t in (x, h0, c0))
    out, (h, c) = model(x, (h0, c0))
    (out.sum() + 0.5 * (h * h).sum() + 0.25 * c.sum()).backward()
    return [out.detach(), h.detach(), c.detach(), x.grad, h0.grad, c0.grad]


def _close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("chunks,bidirectional", [(1, False), (3, False), (4, True)])
def test_replays_equal_the_layers_without_graphs(graphs, chunks, bidirectional):
    plain, graphed = _models(bidirectional)
    directions = 2 if bidirectional else 1
    for seed in range(4):  # eager, captured, replayed, replayed
        x, h0, c0 = _inputs(seed, directions=directions)
        with cuda.flags(stack_graph=chunks):
            got = _step(graphed, x, h0, c0)
        _close(got, _step(plain, x, h0, c0))
    for p, q in zip(graphed.parameters(), plain.parameters()):  # four steps' gradients, added up
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12)
    assert (graphs.captures, graphs.replays) == (1, 3)


def test_outputs_are_copies_the_next_replay_leaves_alone(graphs):
    _, graphed = _models()
    with cuda.flags(stack_graph=1):
        graphed(_inputs(0)[0])
        first = graphed(_inputs(1)[0])[0].detach()  # captured and replayed; no backward to come
        kept = first.clone()
        graphed(_inputs(2)[0])
    assert graphs.replays == 2
    torch.testing.assert_close(first, kept, rtol=0, atol=0)


def test_gradients_are_copies_the_next_replay_leaves_alone(graphs):
    """A hook keeps the gradient it is given (gradient logging, say)."""
    _, graphed = _models()
    seen = []
    with cuda.flags(stack_graph=1):
        for seed in range(3):
            x = _inputs(seed)[0] * 1.0
            x.register_hook(lambda g: seen.append((g, g.clone())))
            graphed(x)[0].pow(2).sum().backward()
    assert graphs.replays == 2
    for g, kept in seen:
        torch.testing.assert_close(g, kept, rtol=0, atol=0)


def test_two_calls_before_one_backward_are_both_right(graphs):
    plain, graphed = _models()
    x = [_inputs(seed)[0] for seed in range(3)]
    check_two_calls_before_one_backward(plain, graphed, x, graphs, 3, _close)


def test_a_backward_whose_buffers_were_replayed_over_raises(graphs):
    _, graphed = _models()
    with cuda.flags(stack_graph=1):
        graphed(_inputs(0)[0])
        out, _ = graphed(_inputs(1)[0])
        loss = out.sum()
        loss.backward(retain_graph=True)  # its backward ran: the next call may replay
        graphed(_inputs(2)[0])
        with pytest.raises(RuntimeError, match="another call has replayed that graph since"):
            loss.backward()


def test_no_graph_where_the_call_does_not_train(graphs):
    _, graphed = _models()
    with cuda.flags(stack_graph=1):
        for _ in range(3):
            with torch.no_grad():
                graphed(_inputs(0)[0])
        for p in graphed.parameters():
            p.requires_grad_(False)
        for _ in range(3):
            graphed(_inputs(0)[0].detach())
    assert (graphs.captures, graphs.replays, len(graphs.entries)) == (0, 0, 0)


def test_a_failed_capture_warns_and_the_shape_runs_eagerly(graphs):
    plain, graphed = _models()

    def refuse(*_):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs.capture = refuse
    with cuda.flags(stack_graph=1):
        _step(graphed, *_inputs(0))
        with pytest.warns(UserWarning, match="could not be captured as a CUDA graph.*operation not permitted"):
            got = _step(graphed, *_inputs(1))
        again = _step(graphed, *_inputs(2))
    assert len(graphs.entries) == 1
    _close(got, _step(plain, *_inputs(1)))
    _close(again, _step(plain, *_inputs(2)))
    assert (graphs.captures, graphs.replays) == (0, 0)


def test_a_capture_failure_names_the_direction_that_failed():
    with pytest.raises(RuntimeError, match="^the backward's capture: boom$"):
        with stack_graph._naming_failure("the backward's capture"):
            raise RuntimeError("boom")


def test_shapes_kept_are_bounded(graphs):
    graphs.max_graphs = 2
    _, graphed = _models()
    with cuda.flags(stack_graph=1):
        for t in (3, 4, 5, 6):
            graphed(torch.randn(t, B, I, dtype=torch.float64))
    assert len(graphs.entries) == 2


def test_the_key_follows_what_a_capture_depends_on():
    x, p = torch.randn(4, 2, 3), torch.randn(5, requires_grad=True)
    key = stack_graph.call_key([x], [p], 2)
    assert stack_graph.call_key([torch.randn(4, 2, 3)], [p], 2) == key  # new values, same buffers' shapes
    assert stack_graph.call_key([x], [p.detach().clone().requires_grad_()], 2) != key  # another weight
    assert stack_graph.call_key([x.transpose(0, 1).contiguous().transpose(0, 1)], [p], 2) != key  # strides
    assert stack_graph.call_key([x], [p], 3) != key
    torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32
    try:
        assert stack_graph.call_key([x], [p], 2) != key
    finally:
        torch.backends.cudnn.allow_tf32 = not torch.backends.cudnn.allow_tf32


def test_a_bad_chunk_count_is_refused_naming_the_switch():
    with pytest.raises(ValueError, match="PIPELSTM_STACK_GRAPH to '5000': it takes a whole number of time chunks"):
        cuda.stack_graph = 5000
    with pytest.raises(TypeError, match=r"stack_graph \(PIPELSTM_STACK_GRAPH\) must be an int"):
        cuda.stack_graph = True
