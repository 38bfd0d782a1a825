"""The layer ops' time loop as a CUDA graph (csrc/graph_replay.h,
csrc/cuda/graph_replay_cuda.cpp): PIPELSTM_CUDA_GRAPHS=1 graphs every call,
=0 none, unset where the layer is small enough for graphs to pay.

The reference is the same op run eagerly (PIPELSTM_CUDA_GRAPHS=0) on the same inputs:
a replay launches the same kernels, so the results agree to rounding (cuBLAS
may pick another algorithm inside a capture). pipelstm._C._graph_counts()
shows that a graph was captured and replayed, so a silent fallback to the
eager loop fails these tests.

A replay hands out the graph's own outputs (csrc/lent_buffers.h) and that
graph is replayed again only once nothing holds them; outputs still held
(kept in a list, saved for a backward, passed on as the next call's state)
must keep their values whatever later calls replay.
"""

import pytest
import torch

import pipelstm
from pipelstm import _C
from reference import rel_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
OPS = torch.ops.pipelstm
TOL = 1e-6


def _weights(I=16, H=32, P=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = P or H
    w = dict(w_ih=torch.randn(4 * H, I, generator=g) * I ** -0.5, w_hh=torch.randn(4 * H, out, generator=g) * out ** -0.5,
             b_ih=torch.randn(4 * H, generator=g) * 0.1, b_hh=torch.randn(4 * H, generator=g) * 0.1,
             w_hr=torch.randn(P, H, generator=g) * H ** -0.5 if P else None)
    return {k: None if v is None else v.to(DEVICE) for k, v in w.items()}


def _inputs(T=20, B=4, I=16, H=32, P=None, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = P or H
    return [t.to(DEVICE) for t in (torch.randn(T, B, I, generator=g), torch.randn(B, out, generator=g),
                                   torch.randn(B, H, generator=g))]


def _forward_backward(x, h0, c0, w, reverse):
    """The forward op's outputs and the backward op's gradients for fixed
    output gradients (drawn from the forward's shapes)."""
    out, h_n, c_n, ws = OPS.lstm_layer_forward(x, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], w["w_hr"],
                                               reverse)
    g = torch.Generator(device=DEVICE).manual_seed(2)
    grads = [torch.randn(t.shape, device=DEVICE, generator=g) for t in (out, h_n, c_n)]
    back = OPS.lstm_layer_backward(*grads, x, h0, c0, w["w_ih"], w["w_hh"], w["w_hr"], out, ws, reverse)
    return [out, h_n, c_n, *[b for b in back if b is not None]]


def _assert_close(got, expected):
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert a.shape == e.shape, k
        assert rel_error(a.double(), e.double()) <= TOL, (k, rel_error(a.double(), e.double()))


def _eager(monkeypatch, *args, run=_forward_backward):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "0")
    try:
        return run(*args)
    finally:
        monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")


@pytest.mark.parametrize("P", [None, 8])
@pytest.mark.parametrize("reverse", [False, True])
def test_replays_match_eager_calls_on_new_inputs(P, reverse, monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights(P=P)
    before = _C._graph_counts()
    for seed in range(6):
        args = (*_inputs(P=P, seed=seed), w, reverse)
        got = _forward_backward(*args)
        _assert_close(got, _eager(monkeypatch, *args))
    captures, replays = (a - b for a, b in zip(_C._graph_counts(), before))
    # The forward: warm-up, then captures A (seed 1) and B (seed 2: `got`
    # still holds A's outputs), then A, B, A. The backward reads the
    # forward's lent output and workspace in place, so it has a key per
    # forward capture, each warmed up once (seeds 1 and 2) before its
    # capture (seeds 3 and 4) and replays.
    assert captures == 4
    assert replays == 5 + 3


@pytest.mark.parametrize("dtype,B,H,graphed", [
    (torch.float32, 4, 32, True), (torch.float32, 64, 1024, True), (torch.float32, 65, 1024, False),
    (torch.bfloat16, 256, 1024, True), (torch.bfloat16, 257, 1024, False)])  # B*H*H against 2^26 / 2^28
def test_unset_graphs_only_where_they_pay(dtype, B, H, graphed, monkeypatch):
    # PIPELSTM_CUDA_GRAPHS unset: a layer whose recurrent GEMM is small
    # (launch-bound) is graphed from its second call, a larger one never.
    monkeypatch.delenv("PIPELSTM_CUDA_GRAPHS", raising=False)
    w = {k: None if v is None else v.to(dtype) for k, v in _weights(I=16, H=H).items()}
    x, h0, c0 = (t.to(dtype) for t in _inputs(T=3, B=B, I=16, H=H))
    before = _C._graph_counts()
    for _ in range(3):
        OPS.lstm_layer_forward(x, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], None, False)
    captures, replays = (a - b for a, b in zip(_C._graph_counts(), before))
    assert (captures, replays) == ((1, 2) if graphed else (0, 0))


def test_weights_updated_in_place_are_seen(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights()
    args = (*_inputs(), w, False)
    for _ in range(2):
        _forward_backward(*args)  # captured
    with torch.no_grad():  # what an optimizer step does
        for k in ("w_ih", "w_hh", "b_ih", "b_hh"):
            w[k].mul_(0.9).add_(0.01)
    before = _C._graph_counts()
    got = _forward_backward(*args)
    assert _C._graph_counts()[1] > before[1]  # replayed, not captured again
    _assert_close(got, _eager(monkeypatch, *args))


def test_a_replaced_weight_gets_its_own_graph(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights()
    x, h0, c0 = _inputs()
    for _ in range(2):
        _forward_backward(x, h0, c0, w, False)
    w["w_hh"] = w["w_hh"].clone() * 1.1  # another tensor: another address
    got = _forward_backward(x, h0, c0, w, False)
    _assert_close(got, _eager(monkeypatch, x, h0, c0, w, False))


def test_a_changed_matmul_setting_is_not_replayed_from_the_old_capture(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights(I=64, H=128)
    args = (*_inputs(I=64, H=128), w, False)
    for _ in range(2):
        _forward_backward(*args)
    torch.backends.cuda.matmul.allow_tf32 = True
    got = _forward_backward(*args)
    _assert_close(got, _eager(monkeypatch, *args))  # both with TF32


def test_calls_on_a_side_stream(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights()
    side = torch.cuda.Stream()
    for seed in range(3):
        args = (*_inputs(seed=seed), w, False)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = _forward_backward(*args)
        torch.cuda.current_stream().wait_stream(side)
        _assert_close(got, _eager(monkeypatch, *args))


def test_inside_a_users_capture_the_ops_are_captured_as_before(monkeypatch):
    # The op sees an active capture and runs its step loop into the user's
    # graph, as with PIPELSTM_CUDA_GRAPHS=0.
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights()
    x, h0, c0 = _inputs()
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            OPS.lstm_layer_forward(static_x, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], None, False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = OPS.lstm_layer_forward(static_x, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], None,
                                            False)
    new_x = _inputs(seed=5)[0]
    static_x.copy_(new_x)
    graph.replay()
    expected = OPS.lstm_layer_forward(new_x, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], None, False)
    _assert_close(list(static_out[:3]), list(expected[:3]))


def test_module_training_steps_with_graphs_match_eager(monkeypatch):
    # pipelstm.LSTM on CUDA, a few SGD steps: the same parameters with and
    # without graphs.
    torch.manual_seed(0)
    models = [pipelstm.LSTM(16, 32, num_layers=2).to(DEVICE) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randn(12, 4, 16, device=DEVICE)
    for graphs, model in zip((False, True), models):
        if graphs:
            monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
        else:
            monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "0")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            opt.zero_grad()
            model(x)[0].square().mean().backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert rel_error(b.double(), a.double()) <= 1e-5


def _forward(x, h0, c0, w):
    return OPS.lstm_layer_forward(x, h0, c0, w["w_ih"], w["w_hh"], w["b_ih"], w["b_hh"], w["w_hr"], False)


def test_a_replay_hands_out_the_graphs_own_outputs(monkeypatch):
    # Nothing held between calls: every replay is the same capture's, and
    # its outputs are the graph's memory, not copies of it.
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights(H=40)  # sizes of its own: no other test's graph has its key
    before = _C._graph_counts()
    addresses = []
    for seed in range(5):
        x, h0, c0 = _inputs(H=40, seed=seed)
        out = _forward(x, h0, c0, w)
        addresses.append([t.data_ptr() for t in out])
        _assert_close(list(out), list(_eager(monkeypatch, x, h0, c0, w, run=_forward)))
        del out
    captures, replays = (a - b for a, b in zip(_C._graph_counts(), before))
    assert (captures, replays) == (1, 4)
    assert all(a == addresses[1] for a in addresses[2:])


def test_outputs_kept_across_calls_keep_their_values(monkeypatch):
    # All kept: the second call replays a second capture, the later ones a
    # third that hands out copies; none replays over what is kept.
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights(H=24)
    calls = [_inputs(H=24, seed=seed) for seed in range(6)]
    expected = [_eager(monkeypatch, *args, w, run=_forward) for args in calls]
    before = _C._graph_counts()
    kept = [_forward(*args, w) for args in calls]
    captures, replays = (a - b for a, b in zip(_C._graph_counts(), before))
    assert (captures, replays) == (3, 5)
    for got, e in zip(kept, expected):
        _assert_close(list(got), list(e))


def test_the_ops_lent_states_fed_back_as_the_next_calls_match_eager(monkeypatch):
    # The layer op's own (h_n, c_n), lent by a replay, are the next call's
    # (h0, c0): that call must not replay the capture they belong to.
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights(H=28)
    xs = [_inputs(H=28, seed=seed)[0] for seed in range(6)]
    h, c = _inputs(H=28)[1:]
    h_ref, c_ref = h, c
    before = _C._graph_counts()
    for x in xs:
        out, h, c, _ = _forward(x, h, c, w)
        out_ref, h_ref, c_ref, _ = _eager(monkeypatch, x, h_ref, c_ref, w, run=_forward)
        _assert_close([out, h, c], [out_ref, h_ref, c_ref])
    # The warm-up, capture A, capture B (its states are A's), then A, B, A.
    assert tuple(a - b for a, b in zip(_C._graph_counts(), before)) == (2, 5)


def test_outputs_let_go_on_another_stream_are_read_there_before_the_next_replay(monkeypatch):
    # The caller reads each call's output on a second stream that runs late
    # and lets it go there: the next replay (on the first stream) must wait
    # for that read, as the allocator waits before reusing memory a
    # record_stream names.
    monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", "1")
    w = _weights(H=36)
    calls = [_inputs(H=36, seed=seed) for seed in range(5)]
    expected = [_eager(monkeypatch, *args, w, run=_forward)[0] for args in calls]
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    read = []
    before = _C._graph_counts()
    for args in calls:
        with torch.cuda.stream(first):
            out = _forward(*args, w)[0]
        second.wait_stream(first)
        with torch.cuda.stream(second):
            torch.cuda._sleep(50_000_000)  # tens of milliseconds on any GPU
            read.append(out * 1)
            out.record_stream(second)  # for the warm-up's own tensor; a lent one ignores it
            del out  # let go on the second stream
    torch.cuda.synchronize()
    assert tuple(a - b for a, b in zip(_C._graph_counts(), before)) == (1, 4)  # one capture replayed
    for got, e in zip(read, expected):
        _assert_close([got], [e])


def test_states_passed_on_from_call_to_call_match_eager(monkeypatch):
    # Truncated backpropagation through time: each call starts from the
    # last one's (h_n, c_n), detached, and steps the optimizer.
    torch.manual_seed(0)
    models = [pipelstm.LSTM(16, 32, num_layers=2).to(DEVICE) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    xs = [torch.randn(12, 4, 16, device=DEVICE) for _ in range(6)]
    outputs = []
    for graphs, model in zip(("0", "1"), models):
        monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", graphs)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state, outs = None, []
        for x in xs:
            opt.zero_grad()
            out, state = model(x, state)
            out.square().mean().backward()
            opt.step()
            state = tuple(s.detach() for s in state)
            outs.append(out.detach())
        outputs.append(outs)
    for a, b in zip(*outputs):
        assert rel_error(b.double(), a.double()) <= 1e-5
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert rel_error(b.double(), a.double()) <= 1e-5


def test_two_forwards_before_one_backward_match_eager(monkeypatch):
    # The first call's outputs are saved for the backward while the second
    # call runs: it must not replay over them.
    torch.manual_seed(0)
    models = [pipelstm.LSTM(16, 32).to(DEVICE) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    xs = [torch.randn(12, 4, 16, device=DEVICE) for _ in range(2)]
    grads = []
    for graphs, model in zip(("0", "1"), models):
        monkeypatch.setenv("PIPELSTM_CUDA_GRAPHS", graphs)
        for _ in range(3):  # the warm-up, then captures and replays
            model.zero_grad()
            loss = sum(model(x)[0].square().mean() * (k + 1) for k, x in enumerate(xs))
            loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        assert rel_error(b.double(), a.double()) <= 1e-5
