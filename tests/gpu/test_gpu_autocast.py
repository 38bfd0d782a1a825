"""pipelstm under torch.autocast("cuda") (pipelstm/autocast.py), against
nn.LSTM / nn.LSTMCell.

The reference is the fp32 model without autocast (TF32 off), weights shared
through load_state_dict: under autocast both sides compute in a 16-bit
dtype, so each is compared with the exact fp32 result at that dtype's
tolerance, and with each other. nn.LSTM's cuDNN path casts to float16
whatever dtype autocast asks for; pipelstm uses the asked dtype (so only the
float16 runs compare the two dtypes directly).
"""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from reference import rel_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
# Relative to the fp32 result (max |err| / max |ref|); 16-bit storage of
# every intermediate over a few steps: cuDNN's own fp16 LSTM is within 5e-3
# here, bf16 (8 significant bits) about 8x coarser.
TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}
DTYPES = pytest.mark.parametrize("dtype", list(TOL), ids=["fp16", "bf16"])
CASES = [
    dict(input_size=16, hidden_size=32, num_layers=2),
    dict(input_size=16, hidden_size=32, num_layers=2, bidirectional=True, proj_size=8),
]


def _weighted(outputs, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return sum((o.float() * torch.randn(o.shape, device=DEVICE, generator=g)).sum() for o in outputs)


def _run(model, x, dtype=None):
    """[output, h_n, c_n, d/dx, d/dparams...] with the forward under autocast
    to `dtype` (None: no autocast); the backward outside it, as in training."""
    x = x.detach().requires_grad_()
    if dtype is None:
        out, (h, c) = model(x)
    else:
        with torch.autocast(DEVICE, dtype=dtype):
            out, (h, c) = model(x)
    grads = torch.autograd.grad(_weighted([out, h, c]), [x, *model.parameters()])
    return [out, h, c, *grads]


def _pair(**kw):
    ref = nn.LSTM(**kw).to(DEVICE)
    ours = pipelstm.LSTM(**kw).to(DEVICE)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("kw", CASES)
@DTYPES
def test_module_under_autocast_matches_fp32_and_nn_lstm(kw, dtype):
    ref, ours = _pair(**kw)
    x = torch.randn(12, 4, kw["input_size"], device=DEVICE)
    exact = _run(ref, x)
    got = _run(ours, x, dtype)
    theirs = _run(ref, x, dtype)
    for k, (g, e) in enumerate(zip(got, exact)):
        # Outputs in the autocast dtype; gradients in the leaves' float32.
        assert g.dtype == (dtype if k < 3 else torch.float32), k
        assert torch.isfinite(g).all(), k
        assert rel_error(g.double(), e.double()) <= TOL[dtype], (k, rel_error(g.double(), e.double()))
    if dtype == torch.float16:
        assert [t.dtype for t in theirs[:3]] == [torch.float16] * 3
        for k, (g, t) in enumerate(zip(got, theirs)):
            assert rel_error(g.double(), t.double()) <= TOL[dtype], k


@DTYPES
def test_packed_module_under_autocast(dtype):
    ref, ours = _pair(input_size=5, hidden_size=8, num_layers=2, bidirectional=True)
    seqs = [torch.randn(n, 5, device=DEVICE) for n in (7, 5, 2)]
    expected = ref(pack_sequence(seqs))
    with torch.autocast(DEVICE, dtype=dtype):
        got = ours(pack_sequence(seqs))
    assert got[0].data.dtype == dtype
    for g, e in zip((got[0].data, *got[1]), (expected[0].data, *expected[1])):
        assert rel_error(g.double(), e.double()) <= TOL[dtype]


@DTYPES
def test_cell_under_autocast_matches_nn_lstm_cell(dtype):
    ref = nn.LSTMCell(16, 32).to(DEVICE)
    ours = pipelstm.LSTMCell(16, 32).to(DEVICE)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 16, device=DEVICE)
    hx = (torch.randn(4, 32, device=DEVICE), torch.randn(4, 32, device=DEVICE))
    exact = ref(x, hx)
    with torch.autocast(DEVICE, dtype=dtype):
        got = ours(x, hx)
        theirs = ref(x, hx)
    for g, t, e in zip(got, theirs, exact):
        assert g.dtype == t.dtype == dtype
        assert rel_error(g.double(), e.double()) <= TOL[dtype]
        assert rel_error(g.double(), t.double()) <= TOL[dtype]


def test_a_grad_scaler_training_step_under_autocast():
    # The AMP recipe: autocast forward, scaled backward, unscaled step; the
    # parameters move as without autocast, within fp16's tolerance.
    ref, ours = _pair(input_size=8, hidden_size=16, num_layers=2)
    x = torch.randn(10, 4, 8, device=DEVICE)
    target = torch.randn(10, 4, 16, device=DEVICE)
    steps = {}
    for name, model, amp in (("fp32", ref, False), ("amp", ours, True)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(DEVICE, enabled=amp)
        before = [p.detach().clone() for p in model.parameters()]
        with torch.autocast(DEVICE, dtype=torch.float16, enabled=amp):
            loss = nn.functional.mse_loss(model(x)[0].float(), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        steps[name] = [p.detach() - b for p, b in zip(model.parameters(), before)]
    for k, (a, e) in enumerate(zip(steps["amp"], steps["fp32"])):
        assert rel_error(a.double(), e.double()) <= TOL[torch.float16], k
