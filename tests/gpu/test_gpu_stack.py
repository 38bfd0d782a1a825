"""The whole stack on one GPU: the pipeline engine's CUDA streams and copy
stream, pipelstm.LSTM(devices=[cuda...]), the training example, and the
distributed path with CUDA tensors (two processes sharing the GPU over gloo,
transfers through host copies: NCCL refuses two ranks on one device), each
against the unsplit / single-process run; compute-sanitizer on the ops.

Run on an H200 (docs/design/cuda.md, "Testing on a GPU"); the pass-ordering test is newer
than that run in the form it has here.
"""

import copy
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

import pipelstm
from distributed_utils import ROOT, SMALL, TRAIN_LM, max_difference, reference_parameters, torchrun
from reference import rel_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOL = 1e-5


def _lm(V=37, E=6, H=8, O=5):
    return nn.Sequential(nn.Embedding(V, E), pipelstm.LSTM(E, H, num_layers=3), nn.Linear(H, O))


def _forward_backward(model, x, hx):
    hx = tuple(t.clone().requires_grad_() for t in hx)
    out, (h, c) = model(x, hx)
    g = torch.Generator(device=out.device).manual_seed(3)
    cot = [torch.randn(t.shape, device=t.device, generator=g) for t in (out, h, c)]
    sum((t * w).sum() for t, w in zip((out, h, c), cot)).backward()
    return [out, h, c, *[p.grad for p in model.parameters()], *[t.grad for t in hx]]


def _run_reference(model, x, hx):
    emb, lstm, dec = model
    out, state = lstm(emb(x), hx)
    return dec(out), state


class _Reference(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, hx):
        return _run_reference(self.model, x, hx)


@pytest.mark.parametrize("K,M", [(1, 1), (3, 2)])
def test_two_stages_on_one_gpu_match_the_unsplit_model(K, M):
    # Two stages on cuda:0: separate compute streams, the copy stream and
    # events between them.
    torch.manual_seed(0)
    base = _lm().to(DEVICE)
    ref, piped = copy.deepcopy(base), copy.deepcopy(base)
    pipe = pipelstm.Pipeline(piped, devices=[DEVICE, DEVICE], chunks=K, micro_batches=M, balance=[2, 3])
    T, B = 11, 5
    x = torch.randint(0, 37, (T, B), device=DEVICE)
    hx = (torch.randn(3, B, 8, device=DEVICE), torch.randn(3, B, 8, device=DEVICE))
    got = _forward_backward(pipe, x, hx)
    expected = _forward_backward(_Reference(ref), x, hx)
    assert len(got) == len(expected)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert a.device.type == "cuda" and a.shape == e.shape, k
        assert rel_error(a.double(), e.double()) <= TOL, (k, rel_error(a.double(), e.double()))


def test_lstm_with_devices_on_the_gpu_matches_nn_lstm():
    torch.manual_seed(0)
    ref = nn.LSTM(4, 6, num_layers=3).to(DEVICE)
    ours = pipelstm.LSTM(4, 6, num_layers=3, devices=[DEVICE, DEVICE], chunks=3, micro_batches=2)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(8, 5, 4, device=DEVICE)
    hx = (torch.randn(3, 5, 6, device=DEVICE), torch.randn(3, 5, 6, device=DEVICE))
    got = _forward_backward(ours, x, hx)
    expected = _forward_backward(ref, x, hx)
    for k, (a, e) in enumerate(zip(got, expected)):
        assert rel_error(a.double(), e.double()) <= TOL, k


def test_a_pass_runs_after_the_callers_work_and_before_what_the_caller_does_next():
    # The stages compute on streams of their own. They must start after what
    # the caller queued before the pass (here a new input and halved weights,
    # queued behind a long sleep on the current stream), and the caller's
    # stream must go on only after what they queued (the weight gradients,
    # computed last, read at once below). Before the pass was ordered so, the
    # pp=2 gloo run below crashed on an H200 (an illegal address) in 5 of 9 runs.
    torch.manual_seed(0)
    I, H, T, B = 64, 512, 64, 64
    ours = pipelstm.LSTM(I, H, num_layers=2, devices=[DEVICE, DEVICE], chunks=4, micro_batches=2)
    x = torch.randn(T, B, I, device=DEVICE)
    new_x = torch.randn(T, B, I, device=DEVICE)
    # A first step: its one-time set-up (cuBLAS, the stage streams' memory)
    # may wait on the host, and then the sleep below would be over before
    # the stages queue anything. Without this step the test passed on the
    # unordered pass too.
    out, (h, c) = ours(x)
    (out.sum() + h.sum() + c.sum()).backward()
    ours.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # about 0.2 s: the host queues the whole step meanwhile
    x.copy_(new_x)
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(0.5)
    out, (h, c) = ours(x)
    (out.sum() + h.sum() + c.sum()).backward()
    got = [t.clone() for t in (out, h, c, *[p.grad for p in ours.parameters()])]
    torch.cuda.synchronize()

    ref = nn.LSTM(I, H, num_layers=2).double()
    ref.load_state_dict({k: v.detach().cpu().double() for k, v in ours.state_dict().items()})
    out_r, (h_r, c_r) = ref(new_x.cpu().double())
    (out_r.sum() + h_r.sum() + c_r.sum()).backward()
    expected = [out_r, h_r, c_r, *[p.grad for p in ref.parameters()]]
    for k, (a, e) in enumerate(zip(got, expected)):
        assert rel_error(a.double().cpu(), e) <= 1e-4, (k, rel_error(a.double().cpu(), e))


def test_the_training_example_on_the_gpu_matches_nn_lstm(tmp_path):
    # One process, the model on the GPU; the reference is the same training
    # with torch's nn.LSTM on the CPU.
    steps = 5
    args = SMALL + ["--max-steps", str(steps), "--device", "cuda", "--save-model", str(tmp_path / "model.pt")]
    result = subprocess.run([sys.executable, str(TRAIN_LM), *args], capture_output=True, text=True, timeout=600,
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trained = {k: v.cpu() for k, v in torch.load(tmp_path / "model.pt").items()}
    assert max_difference(trained, reference_parameters(steps, SMALL)) <= 1e-4


def test_two_processes_sharing_the_gpu_over_gloo_match_one_process(tmp_path):
    # pp=2 on one GPU: both ranks on cuda:0, activations and gradients
    # through host copies over gloo.
    steps = 5
    result = torchrun(2, SMALL + ["--pp", "2", "--device", "cuda", "--max-steps", str(steps), "--save-model",
                                  str(tmp_path / "model.pt")], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "(gloo)" in result.stdout and "cuda:0" in result.stdout
    trained = {k: v.cpu() for k, v in torch.load(tmp_path / "model.pt").items()}
    assert max_difference(trained, reference_parameters(steps, SMALL)) <= 1e-4


_SANITIZED = """
import torch, pipelstm
ops = torch.ops.pipelstm
for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
    for H, P in ((32, None), (13, None), (32, 8)):
        T, B, I = 5, 3, 7
        d = dict(device="cuda", dtype=dtype)
        x, h0, c0 = torch.randn(T, B, I, **d), torch.randn(B, P or H, **d), torch.randn(B, H, **d)
        w_ih, w_hh = torch.randn(4 * H, I, **d), torch.randn(4 * H, P or H, **d)
        b = torch.randn(4 * H, **d)
        w_hr = torch.randn(P, H, **d) if P else None
        for reverse in (False, True):
            out, h_n, c_n, ws = ops.lstm_layer_forward(x, h0, c0, w_ih, w_hh, b, b, w_hr, reverse)
            ops.lstm_layer_backward(torch.randn_like(out), None, torch.randn_like(c_n), x, h0, c0, w_ih, w_hh,
                                    w_hr, out, ws, reverse)
        hy, cy, cws = ops.lstm_cell_forward(torch.randn(B, 4 * H, **d), torch.randn(B, 4 * H, **d), c0, b, b)
        ops.lstm_cell_backward(torch.randn_like(hy), None, c0, cy, cws)
torch.cuda.synchronize()
print("ok")
"""


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer is not on PATH")
@pytest.mark.parametrize("env", [{"PIPELSTM_CUDA_GRAPHS": "0"}, {"PIPELSTM_PERSISTENT": "1", "PIPELSTM_CUDA_GRAPHS": "0"},
                                 {"PIPELSTM_CUDA_GRAPHS": "1"}], ids=["step-loop", "persistent", "graphs"])
def test_compute_sanitizer_finds_nothing_in_the_ops(env):
    result = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", sys.executable,
                             "-c", _SANITIZED], capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, **env))
    assert result.returncode == 0 and "ok" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
