"""The CUDA ops against nn.LSTM (cuDNN) and against the CPU ops.

Runs only where a GPU exists (see conftest.py). The layer and cell ops are
compared forward and backward (every gradient), with and without projection
and biases, in both directions, in fp32 (TF32 off), fp16 and bf16; then
pipelstm.LSTM as a module; then CUDA-graph capture of forward + backward.

Every comparison feeds both sides the same numbers: inputs, weights and
output gradients are drawn in fp32 and rounded to the dtype under test, and
the reference computes in fp64 from those rounded values, cuDNN's fp64 LSTM
(nn.LSTM on CUDA in float64) or the CPU ops in fp64, so the error measured
is the CUDA op's own. Error is max |ours - ref| / max |ref| (rel_error).
"""

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

import pipelstm
from reference import rel_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda"

# (forward, backward) tolerance per dtype (docs/testing.md has the
# measurements): fp32 within 1e-6 (fp32 cuDNN itself is about 1e-5 from its
# fp64 result, hence the fp64 reference); fp16 within 2e-3; bf16 (8
# significant bits) up to about 1e-2 forward, where a float64 emulation of
# the op's roundings reaches as well, and 1.5e-2 in the gradients.
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1.5e-2, 2e-2),
}
DTYPES = pytest.mark.parametrize("dtype", list(TOL), ids=["fp32", "fp16", "bf16"])


def _rounded(t, dtype):
    return t.to(dtype).float()


def _grads(outputs, cotangents, leaves, retain_graph=False):
    loss = sum((o.double() * g.to(o.device, torch.float64)).sum() for o, g in zip(outputs, cotangents))
    return torch.autograd.grad(loss, leaves, retain_graph=retain_graph)


def _cotangents(expected, dtype):
    return [_rounded(torch.randn(e.shape), dtype) for e in expected]


def _assert_close(name, actual, expected, tol):
    err = rel_error(actual.detach().double().cpu(), expected.detach().double().cpu())
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol:g}"


def _layer_leaves(T, B, I, H, P, bias, dtype):
    """Leaves of one layer direction, fp32 values already rounded to `dtype`."""
    Hout = P or H

    def rnd(*shape, scale=0.5):
        return _rounded(torch.randn(*shape) * scale, dtype)

    return dict(
        input=rnd(T, B, I, scale=1.0),
        h0=rnd(B, Hout),
        c0=rnd(B, H),
        w_ih=rnd(4 * H, I, scale=I**-0.5),
        w_hh=rnd(4 * H, Hout, scale=Hout**-0.5),
        b_ih=rnd(4 * H) if bias else None,
        b_hh=rnd(4 * H) if bias else None,
        w_hr=rnd(Hout, H, scale=H**-0.5) if P else None,
    )


def _on(leaves, device, dtype):
    return {k: (v.to(device, dtype).requires_grad_() if v is not None else None) for k, v in leaves.items()}


def _present(args):
    return [(k, v) for k, v in args.items() if v is not None]


# --- the layer op ----------------------------------------------------------------

LAYER_CASES = [
    # T, B, I, H, P, bias
    (7, 5, 12, 16, 0, True),  # H a multiple of every vector width: 16-byte path
    (7, 5, 12, 16, 4, True),  # projection
    (5, 3, 7, 13, 0, False),  # odd H: scalar path; no biases
    (4, 33, 24, 40, 0, True),  # more rows than one warp
    (32, 8, 64, 64, 16, True),  # a longer sequence, with projection
]
LAYER = pytest.mark.parametrize(
    "case", LAYER_CASES, ids=lambda c: "T{}B{}I{}H{}P{}{}".format(*c[:5], "" if c[5] else "nobias")
)
REVERSE = pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])


def _cudnn_direction(leaves, case, reverse):
    """One direction of nn.LSTM in fp64 (cuDNN) from `leaves`: the expected
    (output, h_n, c_n) and a function of cotangents giving every gradient, in
    the order of the op's leaves. Reverse is the second direction of a
    bidirectional LSTM."""
    T, B, I, H, P, bias = case
    Hout = P or H
    ref = nn.LSTM(I, H, proj_size=P, bias=bias, bidirectional=reverse).to(DEVICE, torch.float64)
    d = 1 if reverse else 0
    sfx = "_reverse" if reverse else ""
    names = {"w_ih": f"weight_ih_l0{sfx}", "w_hh": f"weight_hh_l0{sfx}", "b_ih": f"bias_ih_l0{sfx}",
             "b_hh": f"bias_hh_l0{sfx}", "w_hr": f"weight_hr_l0{sfx}"}
    with torch.no_grad():
        for k, n in names.items():
            if leaves[k] is not None:
                getattr(ref, n).copy_(leaves[k])
    x = leaves["input"].to(DEVICE, torch.float64).requires_grad_()
    h0 = torch.zeros(d + 1, B, Hout, device=DEVICE, dtype=torch.float64)
    c0 = torch.zeros(d + 1, B, H, device=DEVICE, dtype=torch.float64)
    h0[d], c0[d] = leaves["h0"], leaves["c0"]
    h0.requires_grad_()
    c0.requires_grad_()
    out, (h_n, c_n) = ref(x, (h0, c0))
    if out.is_cuda:
        assert type(out.grad_fn).__name__.startswith("Cudnn"), out.grad_fn  # the reference is cuDNN's
    expected = (out[..., d * Hout : (d + 1) * Hout], h_n[d], c_n[d])
    params = [getattr(ref, names[k]) for k, v in _present(leaves) if k in names]

    def grads(cot):
        g = _grads(expected, cot, [x, h0, c0, *params])
        return [g[0], g[1][d], g[2][d], *g[3:]]

    return expected, grads


def _cpu_direction(leaves, case, reverse):
    """The CPU op in fp64 from `leaves`: the expected (output, h_n, c_n) and a
    function of cotangents giving every gradient, in the order of the op's
    leaves."""
    cpu = _on(leaves, "cpu", torch.float64)
    expected = pipelstm.ops.lstm_layer(**cpu, reverse=reverse)
    return expected, lambda cot: _grads(expected, cot, [v for _, v in _present(cpu)])


@DTYPES
@REVERSE
@LAYER
@pytest.mark.parametrize("reference", [_cudnn_direction, _cpu_direction], ids=["cudnn", "cpu_op"])
def test_layer_op_matches(reference, case, reverse, dtype):
    fw_tol, bw_tol = TOL[dtype]
    leaves = _layer_leaves(*case, dtype)
    expected, ref_grads = reference(leaves, case, reverse)
    args = _on(leaves, DEVICE, dtype)
    actual = pipelstm.ops.lstm_layer(**args, reverse=reverse)
    for name, a, e in zip(("output", "h_n", "c_n"), actual, expected):
        assert a.dtype == dtype and a.device.type == DEVICE
        _assert_close(name, a, e, fw_tol)

    cot = _cotangents(expected, dtype)
    grads = _grads(actual, cot, [v for _, v in _present(args)])
    for (name, _), g, g_r in zip(_present(args), grads, ref_grads(cot)):
        assert g.dtype == dtype
        _assert_close(f"grad {name}", g, g_r, bw_tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_layer_op_fp64_and_only_some_outputs_used(dtype):
    # fp64 runs on CUDA too; a loss on h_n alone (no output gradient) or on
    # c_n alone gives the same gradients as on the CPU.
    leaves = _layer_leaves(6, 4, 8, 16, 0, True, torch.float32)
    cpu = _on(leaves, "cpu", torch.float64)
    gpu = _on(leaves, DEVICE, dtype)
    expected = pipelstm.ops.lstm_layer(**cpu, reverse=True)
    actual = pipelstm.ops.lstm_layer(**gpu, reverse=True)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, a, e in zip(("output", "h_n", "c_n"), actual, expected):
        _assert_close(name, a, e, tol)
    for used in (1, 2):
        cot = _cotangents(expected[used : used + 1], torch.float32)
        grads = _grads(actual[used : used + 1], cot, [v for _, v in _present(gpu)], retain_graph=True)
        grads_r = _grads(expected[used : used + 1], cot, [v for _, v in _present(cpu)], retain_graph=True)
        for (name, _), g, g_r in zip(_present(gpu), grads, grads_r):
            _assert_close(f"grad {name} (output {used} used)", g, g_r, tol)


def test_packed_layer_op_matches_cpu_op():
    lengths, I, H, P = [5, 2, 7, 1, 7], 6, 16, 4
    packed = pack_sequence([torch.randn(n, I) for n in lengths], enforce_sorted=False)
    leaves = _layer_leaves(1, len(lengths), I, H, P, True, torch.float32)
    leaves["input"] = packed.data
    cpu = _on(leaves, "cpu", torch.float64)
    gpu = _on(leaves, DEVICE, torch.float32)
    for reverse in (False, True):
        kw = dict(batch_sizes=packed.batch_sizes, reverse=reverse)  # batch_sizes stays on the CPU
        expected = pipelstm.ops.lstm_packed_layer(**cpu, **kw)
        actual = pipelstm.ops.lstm_packed_layer(**gpu, **kw)
        for name, a, e in zip(("output", "h_n", "c_n"), actual, expected):
            _assert_close(name, a, e, 1e-5)
        cot = _cotangents(expected, torch.float32)
        grads = _grads(actual, cot, [v for _, v in _present(gpu)])
        grads_r = _grads(expected, cot, [v for _, v in _present(cpu)])
        for (name, _), g, g_r in zip(_present(gpu), grads, grads_r):
            _assert_close(f"grad {name}", g, g_r, 1e-5)


# --- the cell op -----------------------------------------------------------------

# B, H. One element (1, 1) only in fp32: with a single element, max |ref| is
# that element, and a 16-bit rounding of a value near zero is a large error.
CELL = pytest.mark.parametrize(
    "B,H,dtype",
    [(1, 1, torch.float32)]
    + [(B, H, dtype) for B, H in [(2, 8), (5, 16), (33, 13), (64, 256)] for dtype in TOL],
    ids=lambda v: {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(v, str(v)),
)
BIAS = pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])


@CELL
@BIAS
def test_cell_op_matches_cudnn(B, H, dtype, bias):
    # One step of nn.LSTM (cuDNN, fp64) from (h0, c0) equals the cell op on
    # gates x @ w_ih.T and h0 @ w_hh.T; gradients flow through both GEMMs.
    fw_tol, bw_tol = TOL[dtype]
    I = 8
    case = (1, B, I, H, 0, bias)
    leaves = _layer_leaves(*case, dtype)
    (_, *expected), ref_grads = _cudnn_direction(leaves, case, False)

    a = _on(leaves, DEVICE, dtype)
    gi = a["input"][0] @ a["w_ih"].t()
    gh = a["h0"] @ a["w_hh"].t()
    actual = pipelstm.ops.lstm_cell(gi, gh, a["c0"], a["b_ih"], a["b_hh"])
    for name, o, e in zip(("hy", "cy"), actual, expected):
        assert o.dtype == dtype
        _assert_close(name, o, e, fw_tol)

    cot = _cotangents(expected, dtype)
    grads = _grads(actual, cot, [v for _, v in _present(a)])
    # The reference's output sequence (one step: h_n again) gets no gradient.
    for (name, _), g, g_r in zip(_present(a), grads, ref_grads([torch.zeros(1, B, H), *cot])):
        _assert_close(f"grad {name}", g, g_r, bw_tol)


@CELL
@BIAS
def test_cell_op_matches_cpu_op(B, H, dtype, bias):
    fw_tol, bw_tol = TOL[dtype]

    def rnd(*shape):
        return _rounded(torch.randn(*shape), dtype)

    leaves = dict(gi=rnd(B, 4 * H), gh=rnd(B, 4 * H), cx=rnd(B, H),
                  b_ih=rnd(4 * H) if bias else None, b_hh=rnd(4 * H) if bias else None)
    cpu = _on(leaves, "cpu", torch.float64)
    gpu = _on(leaves, DEVICE, dtype)
    expected = pipelstm.ops.lstm_cell(*cpu.values())
    actual = pipelstm.ops.lstm_cell(*gpu.values())
    for name, o, e in zip(("hy", "cy"), actual, expected):
        _assert_close(name, o, e, fw_tol)
    cot = _cotangents(expected, dtype)
    for used in ((0, 1), (0,), (1,)):  # both outputs, only hy, only cy
        grads = _grads([actual[i] for i in used], [cot[i] for i in used], [v for _, v in _present(gpu)],
                       retain_graph=True)
        grads_r = _grads([expected[i] for i in used], [cot[i] for i in used], [v for _, v in _present(cpu)],
                         retain_graph=True)
        for (name, _), g, g_r in zip(_present(gpu), grads, grads_r):
            _assert_close(f"grad {name} (outputs {used})", g, g_r, bw_tol)


# --- pipelstm.LSTM (the module) ---------------------------------------------------

CASES = [
    dict(input_size=16, hidden_size=32, num_layers=2),
    dict(input_size=16, hidden_size=32, num_layers=2, bidirectional=True),
    dict(input_size=16, hidden_size=32, num_layers=1, proj_size=8),
    dict(input_size=7, hidden_size=13, num_layers=2, batch_first=True),  # no vector path (H % 4 != 0)
]


def _module_pair(dtype, **kw):
    """pipelstm.LSTM in `dtype` and nn.LSTM in fp64 with the same (rounded) weights."""
    ours = pipelstm.LSTM(**kw).to(DEVICE, dtype)
    ref = nn.LSTM(**kw).to(DEVICE, torch.float64)
    ref.load_state_dict(ours.state_dict())
    return ref, ours


@pytest.mark.parametrize("kw", CASES)
@DTYPES
def test_module_matches_cudnn(kw, dtype):
    fw_tol, bw_tol = TOL[dtype]
    ref, ours = _module_pair(dtype, **kw)
    shape = (3, 9, kw["input_size"]) if kw.get("batch_first") else (9, 3, kw["input_size"])
    x = _rounded(torch.randn(*shape), dtype)
    x_r = x.to(DEVICE, torch.float64).requires_grad_()
    x_o = x.to(DEVICE, dtype).requires_grad_()
    expected = (lambda o: (o[0], *o[1]))(ref(x_r))
    actual = (lambda o: (o[0], *o[1]))(ours(x_o))
    for name, a, e in zip(("output", "h_n", "c_n"), actual, expected):
        assert a.dtype == dtype
        _assert_close(name, a, e, fw_tol)
    cot = _cotangents(expected, dtype)
    names = [n for n, _ in ref.named_parameters()]
    params_o = dict(ours.named_parameters())
    grads = _grads(actual, cot, [x_o] + [params_o[n] for n in names])
    grads_r = _grads(expected, cot, [x_r] + [p for _, p in ref.named_parameters()])
    for name, g, g_r in zip(["input"] + names, grads, grads_r):
        _assert_close(f"grad {name}", g, g_r, bw_tol)


def test_packed_module_matches_cudnn():
    ref, ours = _module_pair(torch.float32, input_size=5, hidden_size=8, num_layers=2, bidirectional=True)
    seqs = [torch.randn(n, 5) for n in (4, 7, 2)]
    out_r, (h_r, c_r) = ref(pack_sequence([s.to(DEVICE, torch.float64) for s in seqs], enforce_sorted=False))
    out_o, (h_o, c_o) = ours(pack_sequence([s.to(DEVICE) for s in seqs], enforce_sorted=False))
    for name, a, e in (("output", out_o.data, out_r.data), ("h_n", h_o, h_r), ("c_n", c_o, c_r)):
        _assert_close(name, a, e, 1e-5)
    cot = _cotangents([out_r.data, h_r, c_r], torch.float32)
    names = [n for n, _ in ref.named_parameters()]
    params_o = dict(ours.named_parameters())
    grads = _grads([out_o.data, h_o, c_o], cot, [params_o[n] for n in names])
    grads_r = _grads([out_r.data, h_r, c_r], cot, [p for _, p in ref.named_parameters()])
    for name, g, g_r in zip(names, grads, grads_r):
        _assert_close(f"grad {name}", g, g_r, 1e-5)


# --- CUDA graphs -----------------------------------------------------------------


def _captured(step, warmups):
    """``(graph, what step() returned while captured)``: ``warmups`` eager calls of ``step`` on a side
    stream first, as capture asks; the returned tensors are the graph's, refilled by every replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


@pytest.mark.parametrize("P,reverse", [(0, False), (4, True)])
def test_cuda_graph_capture_of_layer_op(P, reverse):
    # Forward and backward of the op, captured once and replayed on new data:
    # nothing in either may synchronise with the host or allocate outside the
    # graph's pool, and the replay must give what an eager call gives.
    T, B, I, H = 6, 4, 8, 16
    leaves = _layer_leaves(T, B, I, H, P, True, torch.float32)
    static = _on(leaves, DEVICE, torch.float32)
    params = [v for _, v in _present(static)]
    cot = [c.to(DEVICE) for c in _cotangents([torch.empty(T, B, P or H), torch.empty(B, P or H), torch.empty(B, H)],
                                             torch.float32)]

    def step():
        outs = pipelstm.ops.lstm_layer(**static, reverse=reverse)
        return outs, _grads(outs, cot, params)

    graph, (static_outs, static_grads) = _captured(step, warmups=3)

    for trial in range(2):
        fresh = _layer_leaves(T, B, I, H, P, True, torch.float32)
        with torch.no_grad():
            for k in ("input", "h0", "c0"):
                static[k].copy_(fresh[k])
        graph.replay()
        torch.cuda.synchronize()
        eager = {k: v.detach().clone().requires_grad_() if v is not None else None for k, v in static.items()}
        outs = pipelstm.ops.lstm_layer(**eager, reverse=reverse)
        grads = _grads(outs, cot, [v for _, v in _present(eager)])
        for a, b in zip(static_outs, outs):
            assert rel_error(a, b) <= 1e-6, trial
        for (name, _), a, b in zip(_present(static), static_grads, grads):
            assert rel_error(a, b) <= 1e-6, (trial, name)


# Autograd warns that the parameters' gradient accumulators were made on the
# warm-up stream; harmless here (the capture and its replays are checked).
@pytest.mark.filterwarnings("ignore:The AccumulateGrad node's stream")
def test_cuda_graph_capture_forward_backward():
    T, B, I, H = 5, 4, 8, 16
    lstm = pipelstm.LSTM(I, H).cuda()
    static_x = torch.randn(T, B, I, device="cuda", requires_grad=True)

    def step():
        out, _ = lstm(static_x)
        grads = torch.autograd.grad(out.sum(), [static_x, *lstm.parameters()])
        return out, grads

    graph, (static_out, static_grads) = _captured(step, warmups=2)

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


# --- the persistent recurrent kernel (PIPELSTM_PERSISTENT=1) ----------------------

PERSISTENT_SCRIPT = """
import os, torch, pipelstm
from torch import nn
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 5e-3)):
    # B = 40: a block finishes more pairs than half its warps, so the
    # tensor-core kernels run K unsplit (each item's cells loaded before it).
    for H, B, reverse in ((64, 4, False), (256, 8, True), (1024, 2, False), (512, 40, True)):
        # fp64 cuDNN is the reference: fp32 cuDNN is itself about 1e-5 off.
        ref = nn.LSTM(32, H, bidirectional=reverse).cuda().double()
        ours = pipelstm.LSTM(32, H, bidirectional=reverse).cuda()
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(50, B, 32, device="cuda")
        out_r, (h_r, c_r) = ref(x.double())
        out_o, (h_o, c_o) = ours.to(dtype)(x.to(dtype))
        for a, b in ((out_o, out_r), (h_o, h_r), (c_o, c_r)):
            err = ((a.double() - b).abs().max() / b.abs().max()).item()
            assert err <= tol, (dtype, H, B, reverse, err)
        g_o = torch.autograd.grad(out_o.float().sum(), list(ours.parameters()))
        g_r = torch.autograd.grad(out_r.sum(), list(ref.parameters()))
        for a, b in zip(g_o, g_r):
            assert ((a.double() - b).abs().max() / b.abs().max()).item() <= (tol if dtype == torch.float32 else 5e-2)
# float16 and bfloat16 run the tensor-core kernels, forward and backward:
# one cluster's on Hopper where PIPELSTM_PERSISTENT_KERNEL asks for them.
kind = "cluster" if (os.environ["PIPELSTM_PERSISTENT_KERNEL"] != "grid"
                     and torch.cuda.get_device_capability()[0] == 9) else "tc"
for dtype in (torch.float16, torch.bfloat16):
    ours = pipelstm.LSTM(64, 256).cuda().to(dtype)
    x = torch.randn(20, 8, 64, device="cuda", dtype=dtype, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        ours(x)[0].float().sum().backward()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    assert any(kind + "_forward_kernel" in n for n in names), (dtype, sorted(names))
    assert any(kind + "_backward_kernel" in n for n in names), (dtype, sorted(names))
print("ok")
"""


@pytest.mark.parametrize("kernel", ["grid", "cluster", "cluster_async"])
def test_persistent_kernel_matches_cudnn(kernel):
    # A fresh process, so no graph or buffer of another kernel is reused.
    import os
    import subprocess
    import sys

    env = dict(os.environ, PIPELSTM_PERSISTENT="1", PIPELSTM_PERSISTENT_KERNEL=kernel)
    result = subprocess.run([sys.executable, "-c", PERSISTENT_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
