"""The stack graph on one GPU (pipelstm.stack.graph): a stack's training call
captured as one CUDA graph each way must give what nn.LSTM (cuDNN) gives,
values and every gradient, on every replay; two calls before one backward
must both be right; dropout must draw new masks per replay, as eager calls
do; and with a wavefront inside, two layers' kernels must run at once.
"""

import json

import pytest
import torch
from torch import nn

import pipelstm
from pipelstm.stack import graph as stack_graph
from pipelstm.backends import cuda as cuda_switches
from reference import rel_error
from stack_graph_cases import check_two_calls_before_one_backward

pytestmark = pytest.mark.gpu

T, B, H, LAYERS = 60, 8, 256, 4


@pytest.fixture(autouse=True)
def _fresh_graphs(monkeypatch):
    """Each test counts its own captures."""
    monkeypatch.setattr(stack_graph, "_graphs", stack_graph.StackGraphs())
    return stack_graph._graphs


def _models(dtype=torch.float32, dropout=0.0):
    torch.manual_seed(0)
    ref = nn.LSTM(H, H, num_layers=LAYERS, dropout=dropout).cuda().to(dtype)
    ours = pipelstm.LSTM(H, H, num_layers=LAYERS, dropout=dropout).cuda().to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _inputs(seed, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype, generator=g)
    h0, c0 = torch.randn(2, LAYERS, B, H, device="cuda", dtype=dtype, generator=g).unbind(0)
    return x, h0, c0


def _run(model, x, h0, c0):
    """The outputs and every gradient of one call (the parameters' zeroed first)."""
    model.zero_grad(set_to_none=True)
    x, h0, c0 = (t.clone().requires_grad_() for t in (x, h0, c0))
    out, (h, c) = model(x, (h0, c0))
    (out.sum() + 0.5 * h.sum() + 0.25 * c.sum()).backward()
    return [out, h, c, x.grad, h0.grad, c0.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("chunks", [1, 4, 15])
def test_every_replay_matches_cudnn(chunks, _fresh_graphs):
    ref, ours = _models()
    with cuda_switches.flags(stack_graph=chunks):
        for seed in range(4):  # eager, captured, replayed, replayed
            got, want = _run(ours, *_inputs(seed)), _run(ref, *_inputs(seed))
            for a, b in zip(got, want):
                assert rel_error(a.double(), b.double()) < 2e-5
    assert (_fresh_graphs.captures, _fresh_graphs.replays) == (1, 3)
    assert pipelstm.backends.cuda.graph_memory() >= _fresh_graphs.memory() > 0


def test_bf16_replays_match_the_layers_without_graphs():
    _, ours = _models(torch.bfloat16)
    for seed in range(3):
        want = _run(ours, *_inputs(seed, torch.bfloat16))
        with cuda_switches.flags(stack_graph=6):
            got = _run(ours, *_inputs(seed, torch.bfloat16))
        for a, b in zip(got, want):
            assert rel_error(a.double(), b.double()) < 2e-2


def test_two_calls_before_one_backward_are_both_right(_fresh_graphs):
    ref, ours = _models()
    x = [_inputs(seed)[0] for seed in range(3)]

    def close(got, want):
        for a, b in zip(got, want):
            assert rel_error(a, b) < 2e-5

    check_two_calls_before_one_backward(ref, ours, x, _fresh_graphs, 4, close)


def test_dropout_draws_as_eager_calls_do():
    """The same seed gives the same masks replayed as in the eager wavefront
    of the same chunks: the graph reads the generator's state at each
    replay."""
    _, ours = _models(dropout=0.3)
    want = []
    with cuda_switches.flags(layer_wavefront=4):
        for seed in range(3):
            torch.manual_seed(100 + seed)
            want.append(_run(ours, *_inputs(seed)))
    with cuda_switches.flags(stack_graph=4):
        for seed in range(3):  # eager, captured, replayed
            torch.manual_seed(100 + seed)
            for a, b in zip(_run(ours, *_inputs(seed)), want[seed]):
                assert rel_error(a.double(), b.double()) < 2e-5


def test_the_layers_run_at_once_in_the_graph(tmp_path):
    _, ours = _models()
    x = torch.randn(T, B, H, device="cuda", requires_grad=True)
    with cuda_switches.flags(stack_graph=10):
        for _ in range(2):  # eager, captured
            ours(x)[0].sum().backward()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            ours(x)[0].sum().backward()
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")
    overlaps = sum(1 for i, a in enumerate(kernels) for b in kernels[i + 1:i + 50] if b[0] < a[1])
    assert overlaps > 0, f"{len(kernels)} kernels, none at once"
