"""The CUDA ops against nn.LSTM (cuDNN) and against the CPU ops.

Runs only where a GPU exists (see conftest.py); everything here is also
checked on the CPU by the top-level suite.
"""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from reference import rel_error

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _pair(dtype, **kw):
    ref = nn.LSTM(**kw).cuda().to(dtype)
    ours = pipelstm.LSTM(**kw).cuda().to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


CASES = [
    dict(input_size=16, hidden_size=32, num_layers=2),
    dict(input_size=16, hidden_size=32, num_layers=2, bidirectional=True),
    dict(input_size=16, hidden_size=32, num_layers=1, proj_size=8),
    dict(input_size=7, hidden_size=13, num_layers=2, batch_first=True),  # no vector path (H % 4 != 0)
]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-2), (torch.bfloat16, 1e-2)])
def test_module_matches_cudnn(kw, dtype, tol):
    ref, ours = _pair(torch.float32, **kw)
    ours = ours.to(dtype)
    shape = (3, 9, kw["input_size"]) if kw.get("batch_first") else (9, 3, kw["input_size"])
    x = torch.randn(*shape, device="cuda")
    out_r, (h_r, c_r) = ref(x)  # fp32 cuDNN is the reference for every dtype
    xo = x.to(dtype).requires_grad_()
    out_o, (h_o, c_o) = ours(xo)
    for a, b in [(out_o, out_r), (h_o, h_r), (c_o, c_r)]:
        assert rel_error(a.float(), b) <= tol
    g_r = torch.autograd.grad(out_r.sum() + h_r.sum(), list(ref.parameters()))
    g_o = torch.autograd.grad(out_o.float().sum() + h_o.float().sum(), list(ours.parameters()))
    for a, b in zip(g_o, g_r):
        assert rel_error(a.float(), b) <= (tol if dtype == torch.float32 else 5e-2)


def test_packed_matches_cudnn():
    ref, ours = _pair(torch.float32, input_size=5, hidden_size=8, num_layers=2, bidirectional=True)
    seq = pack_sequence([torch.randn(n, 5, device="cuda") for n in (4, 7, 2)], enforce_sorted=False)
    out_r, (h_r, _) = ref(seq)
    out_o, (h_o, _) = ours(seq)
    assert rel_error(out_o.data, out_r.data) <= 1e-5 and rel_error(h_o, h_r) <= 1e-5


@pytest.mark.parametrize("reverse", [False, True])
def test_layer_op_cuda_equals_cpu(reverse):
    T, B, I, H = 6, 4, 8, 16
    args = [torch.randn(T, B, I), torch.randn(B, H), torch.randn(B, H), torch.randn(4 * H, I) * 0.3,
            torch.randn(4 * H, H) * 0.3, torch.randn(4 * H), torch.randn(4 * H)]
    cpu = pipelstm.ops.lstm_layer(*[a.double() for a in args], reverse=reverse)
    gpu = pipelstm.ops.lstm_layer(*[a.cuda() for a in args], reverse=reverse)
    for a, b in zip(gpu, cpu):
        assert rel_error(a.cpu().double(), b) <= 1e-5


def test_cuda_graph_capture_forward_backward():
    T, B, I, H = 5, 4, 8, 16
    lstm = pipelstm.LSTM(I, H).cuda()
    static_x = torch.randn(T, B, I, device="cuda", requires_grad=True)

    def step():
        out, _ = lstm(static_x)
        grads = torch.autograd.grad(out.sum(), [static_x, *lstm.parameters()])
        return out, grads

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_grads = step()

    new_x = torch.randn(T, B, I, device="cuda")
    static_x.data.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    x = new_x.clone().requires_grad_()
    out, _ = lstm(x)
    grads = torch.autograd.grad(out.sum(), [x, *lstm.parameters()])
    assert rel_error(static_out, out) <= 1e-6
    for a, b in zip(static_grads, grads):
        assert rel_error(a, b) <= 1e-6


PERSISTENT_SCRIPT = """
import torch, pipelstm
from torch import nn
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
    for H, B, reverse in ((64, 4, False), (256, 8, True), (1024, 2, False)):
        ref = nn.LSTM(32, H, bidirectional=reverse).cuda()
        ours = pipelstm.LSTM(32, H, bidirectional=reverse).cuda()
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(50, B, 32, device="cuda")
        out_r, (h_r, c_r) = ref(x)
        out_o, (h_o, c_o) = ours.to(dtype)(x.to(dtype))
        for a, b in ((out_o, out_r), (h_o, h_r), (c_o, c_r)):
            err = ((a.float() - b).abs().max() / b.abs().max()).item()
            assert err <= tol, (dtype, H, B, reverse, err)
        g_o = torch.autograd.grad(out_o.float().sum(), list(ours.parameters()))
        g_r = torch.autograd.grad(out_r.sum(), list(ref.parameters()))
        for a, b in zip(g_o, g_r):
            assert ((a.float() - b).abs().max() / b.abs().max()).item() <= (tol if dtype == torch.float32 else 5e-2)
print("ok")
"""


def test_persistent_kernel_matches_cudnn():
    # The switch is read once per process, so the check runs in a fresh one.
    import os
    import subprocess
    import sys

    env = dict(os.environ, PIPELSTM_PERSISTENT="1")
    result = subprocess.run([sys.executable, "-c", PERSISTENT_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
