"""The LayerNorm LSTM and zoneout on CUDA, against the CPU's fused ops in
float64 with the same weights (and, for zoneout, the same keep masks):
outputs, final states and every gradient. On CUDA the LayerNorm LSTM's
layer op runs its row kernels (one block a row) and zoneout runs in the CUDA
step loop's pointwise items, neither of which the CPU suite can reach."""

import copy
import os

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from layernorm_twins import float32_twin
from pipelstm import ops

pytestmark = pytest.mark.gpu

# PIPELSTM_TEST_DEVICE=cpu runs these against the CPU itself: only to check
# the tests' own code where there is no GPU.
DEVICE = os.environ.get("PIPELSTM_TEST_DEVICE", "cuda")
TOL = dict(rtol=1e-9, atol=1e-9)


def _both(a, b, grads_a, grads_b):
    for x, y in zip((*a, *grads_a), (*b, *grads_b)):
        torch.testing.assert_close(x.cpu(), y, **TOL)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_layernorm_lstm_matches_the_cpu(bidirectional, packed):
    torch.manual_seed(0)
    cpu = pipelstm.LayerNormLSTM(4, 6, num_layers=2, bidirectional=bidirectional).double()
    with torch.no_grad():
        for name, p in cpu.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
    dev = pipelstm.LayerNormLSTM(4, 6, num_layers=2, bidirectional=bidirectional).double().to(DEVICE)
    dev.load_state_dict(cpu.state_dict())
    seqs = [torch.randn(n, 4, dtype=torch.float64) for n in (7, 3, 5)]
    results = []
    for lstm, device in ((dev, DEVICE), (cpu, "cpu")):
        if packed:
            x = pack_sequence([s.to(device) for s in seqs], enforce_sorted=False)
            out, (h, c) = lstm(x)
            data = out.data
        else:
            x = torch.stack([s[:3] for s in seqs], 1).to(device)
            out, (h, c) = lstm(x)
            data = out
        loss = data.sin().sum() + h.cos().sum() + c.square().sum()
        grads = torch.autograd.grad(loss, list(lstm.parameters()))
        results.append(((data, h, c), grads))
    _both(results[0][0], results[1][0], results[0][1], results[1][1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_layernorm_lstm_is_the_float32_one_rounded(dtype):
    # On CUDA as on the CPU: the fused float32 op on float32 copies (the
    # summed bias among them), its results rounded to the dtype once.
    torch.manual_seed(1)
    m = pipelstm.LayerNormLSTM(8, 16, bidirectional=True).to(DEVICE, dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
    ref = float32_twin(m)
    x = torch.randn(30, 3, 8, device=DEVICE).to(dtype)
    out, (h, c) = m(x)
    want, (want_h, want_c) = ref(x.float())
    for got, w in ((out, want), (h, want_h), (c, want_c)):
        assert got.dtype == dtype
        torch.testing.assert_close(got, w.to(dtype), rtol=0, atol=0)
    grads = torch.autograd.grad(out.float().square().sum(), list(m.parameters()))
    want_grads = torch.autograd.grad(want.to(dtype).float().square().sum(), list(ref.parameters()))
    for got, w in zip(grads, want_grads):
        torch.testing.assert_close(got, w.to(dtype), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("zoneout", [False, True])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("H", [6, 300])  # below and above a row's block of 256 threads
def test_layernorm_layer_op_matches_the_cpu(H, packed, zoneout, reverse, dtype):
    # the fused op itself, forward and backward, with the same keep masks on both devices
    torch.manual_seed(0)
    I = 5
    if packed:
        seq = pack_sequence([torch.randn(n, I, dtype=torch.float64) for n in (6, 4, 1)])
        x, batch_sizes, shape, B = seq.data, seq.batch_sizes, (seq.data.shape[0], H), 3
    else:
        x, batch_sizes, shape, B = torch.randn(6, 3, I, dtype=torch.float64), None, (6, 3, H), 3
    weights = [torch.randn(B, H), torch.randn(B, H), torch.randn(4 * H, I) / I**0.5, torch.randn(4 * H, H) / H**0.5,
               torch.randn(4 * H), torch.rand(4 * H) + 0.5, torch.rand(4 * H) + 0.5, torch.rand(H) + 0.5,
               torch.randn(H)]
    keeps = [(torch.rand(shape) < 0.3).double(), (torch.rand(shape) < 0.4).double()] if zoneout else [None, None]
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-5)
    results = []
    for device in (DEVICE, "cpu"):
        xs = x.to(device, dtype).requires_grad_()
        ts = [t.to(device, dtype).requires_grad_() for t in weights]
        ks = [k if k is None else k.to(device, dtype) for k in keeps]
        out, h, c = pipelstm.layernorm_ops.lstm_layernorm_layer(xs, batch_sizes, *ts, *ks, reverse=reverse)
        loss = out.sin().sum() + h.cos().sum() + c.square().sum()
        results.append(((out, h, c), torch.autograd.grad(loss, [xs, *ts])))
    for a, b in zip((*results[0][0], *results[0][1]), (*results[1][0], *results[1][1])):
        torch.testing.assert_close(a.cpu(), b, **tol)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_zoneout_layer_op_matches_the_cpu(packed, reverse):
    # the same 0/1 keep masks on both devices: CUDA's pointwise items against the CPU's fused loops
    torch.manual_seed(0)
    I, H = 5, 7
    if packed:
        lengths = [6, 4, 1]
        seq = pack_sequence([torch.randn(n, I, dtype=torch.float64) for n in lengths])
        x, batch_sizes, rows = seq.data, seq.batch_sizes, seq.data.shape[0]
        shape, B = (rows, H), len(lengths)
    else:
        x, batch_sizes = torch.randn(6, 3, I, dtype=torch.float64), None
        shape, B = (6, 3, H), 3
    args = [torch.randn(B, H, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64),
            torch.randn(4 * H, I, dtype=torch.float64), torch.randn(4 * H, H, dtype=torch.float64),
            torch.randn(4 * H, dtype=torch.float64), torch.randn(4 * H, dtype=torch.float64)]
    keep_c = (torch.rand(shape) < 0.3).double()
    keep_h = (torch.rand(shape) < 0.4).double()
    results = []
    for device in (DEVICE, "cpu"):
        xs = x.to(device).requires_grad_()
        ts = [t.to(device).requires_grad_() for t in args]
        out, h, c = ops.lstm_zoneout_layer(xs, batch_sizes, *ts, keep_c.to(device), keep_h.to(device),
                                           reverse=reverse)
        loss = out.sin().sum() + h.cos().sum() + c.square().sum()
        results.append(((out, h, c), torch.autograd.grad(loss, [xs, *ts])))
    _both(results[0][0], results[1][0], results[0][1], results[1][1])


@pytest.mark.parametrize("packed", [False, True])
def test_a_cuda_pipeline_of_the_layernorm_lstm_matches_the_cpu_model(packed):
    # each layer a unit on a CUDA stage (the fused op over each time chunk),
    # with zoneout, against the unsplit model on the CPU, both in float64
    torch.manual_seed(0)
    model = torch.nn.Sequential(pipelstm.LayerNormLSTM(4, 6, 3, zoneout=(0.3, 0.2))).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5) if "weight" in name else p.uniform_(-0.5, 0.5)
    model.eval()  # zoneout's expectation: the same on both sides without shared masks
    stage = "cuda:0" if DEVICE == "cuda" else DEVICE
    pipe = pipelstm.Pipeline(copy.deepcopy(model).to(stage), [stage, stage], chunks=3, micro_batches=2).eval()
    if packed:
        x = pack_sequence([torch.randn(n, 4, dtype=torch.float64) for n in (7, 5, 2, 1)])
    else:
        x = torch.randn(7, 4, 4, dtype=torch.float64)
    results = []
    for run, device in ((pipe, stage), (model, "cpu")):
        xs = x.to(device)
        out, (h, c) = run(xs)
        data = out if isinstance(out, torch.Tensor) else out.data
        (data.sin().sum() + h.cos().sum() + c.square().sum()).backward()
        results.append([data.cpu(), h.cpu(), c.cpu()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **TOL)
    for (name, a), (_, b) in zip(pipe.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(a.grad.cpu(), b.grad, **TOL, msg=lambda m: f"{name}: {m}")
    assert pipe.state_dict().keys() == model.state_dict().keys()
