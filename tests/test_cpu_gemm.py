"""The layers' whole-batch CPU GEMMs (csrc/cpu/gemm_cpu.cpp): the input
projection, the input gradient and the weight gradients run on the fused
kernels' packed-panel GEMM or on at::mm, as PIPELSTM_CPU_GEMM picks (read at
each call). Both give the float64 results within float32 rounding, on one
and two threads, dense and packed, with and without a projection; panel
and row-block remainders are in the sizes (4H = 80 is no multiple of a
panel, I = 70 of a depth slice)."""

import pytest
import torch

import pipelstm
from reference import layer, num_threads, packed_layer, rel_error
from test_cpu_fused_loops import GRADS, _args, _float64, _reference_grads, _weights

forward = torch.ops.pipelstm.lstm_layer_forward
packed_forward = torch.ops.pipelstm.lstm_packed_layer_forward
backward = torch.ops.pipelstm.lstm_layer_backward
packed_backward = torch.ops.pipelstm.lstm_packed_layer_backward


def _intel() -> bool:
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)


@pytest.mark.parametrize("gemm", ["own", "aten"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("P", [0, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_dense_layer_matches_float64(gemm, threads, P, reverse, monkeypatch):
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", gemm)
    T, B, I, H = 9, 16, 70, 20  # 144 rows: over the 4 from which auto may pick own
    w = _weights(I, H, P, seed=4)
    x = torch.randn(T, B, I)
    h0, c0 = torch.randn(B, P or H), torch.randn(B, H)
    seeds = [torch.randn(T, B, P or H), torch.randn(B, P or H), torch.randn(B, H)]
    with num_threads(threads):
        out, h_n, c_n, ws = forward(x, h0, c0, *_args(w), reverse)
        got = backward(*seeds, x, h0, c0, w["w_ih"], w["w_hh"], w["w_hr"], out, ws, reverse)
    w64 = _float64(w)
    x64, h064, c064 = (v.double().requires_grad_() for v in (x, h0, c0))
    run = lambda: layer(x64, h064, c064, **w64, reverse=reverse)  # noqa: E731
    for y, want in zip((out, h_n, c_n), run()):
        assert rel_error(y.double(), want.detach()) < 1e-5
    ref = _reference_grads(run, [x64, h064, c064], w64, seeds)
    for name, g, want in zip(GRADS, got, ref):
        assert g.numel() == 0 if want is None else rel_error(g.double(), want) < 1e-5, name


@pytest.mark.parametrize("gemm", ["own", "aten"])
@pytest.mark.parametrize("P", [0, 5])
def test_packed_layer_matches_float64(gemm, P, monkeypatch):
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", gemm)
    I, H = 70, 20
    sizes = [40, 40, 33, 30, 17, 9, 3, 1]  # 173 rows
    w = _weights(I, H, P, seed=5)
    data = torch.randn(sum(sizes), I)
    batch_sizes = torch.tensor(sizes)
    h0, c0 = torch.randn(sizes[0], P or H), torch.randn(sizes[0], H)
    seeds = [torch.randn(sum(sizes), P or H), torch.randn(sizes[0], P or H), torch.randn(sizes[0], H)]
    out, h_n, c_n, ws = packed_forward(data, batch_sizes, h0, c0, *_args(w), False)
    got = packed_backward(*seeds, data, batch_sizes, h0, c0, w["w_ih"], w["w_hh"], w["w_hr"], out, ws, False)
    w64 = _float64(w)
    d64, h064, c064 = (v.double().requires_grad_() for v in (data, h0, c0))
    run = lambda: packed_layer(d64, sizes, h064, c064, **w64, reverse=False)  # noqa: E731
    ref = _reference_grads(run, [d64, h064, c064], w64, seeds)
    for name, g, want in zip(GRADS, got, ref):
        assert g.numel() == 0 if want is None else rel_error(g.double(), want) < 1e-5, name


def test_module_training_step_agrees_across_backends(monkeypatch):
    # A 2-layer bidirectional module, forward and backward, both ways.
    torch.manual_seed(0)
    m = pipelstm.LSTM(48, 40, num_layers=2, bidirectional=True)
    x = torch.randn(20, 12, 48)
    results = {}
    for gemm in ("aten", "own"):
        monkeypatch.setenv("PIPELSTM_CPU_GEMM", gemm)
        m.zero_grad()
        out, _ = m(x)
        out.square().sum().backward()
        results[gemm] = [out.detach()] + [p.grad.clone() for p in m.parameters()]
    for a, b in zip(results["aten"], results["own"]):
        assert rel_error(b.double(), a.double()) < 1e-5


def test_auto_picks_own_only_for_vector_builds_off_intel(monkeypatch):
    monkeypatch.delenv("PIPELSTM_CPU_GEMM", raising=False)
    want = "own" if pipelstm._C.cpu_isa() in ("avx512", "avx2") and not _intel() else "aten"
    assert pipelstm._C.cpu_gemm() == want
    for gemm in ("own", "aten"):
        monkeypatch.setenv("PIPELSTM_CPU_GEMM", gemm)
        assert pipelstm._C.cpu_gemm() == gemm


def test_an_unknown_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", "mkl")
    with pytest.raises(RuntimeError, match="PIPELSTM_CPU_GEMM=mkl is not one of aten, own, auto"):
        pipelstm._C.cpu_gemm()
    with pytest.raises(RuntimeError, match="PIPELSTM_CPU_GEMM=mkl"):
        pipelstm.LSTM(8, 8)(torch.randn(20, 8, 8))


def _operand(rows, cols, layout, g):
    """A [rows, cols] float32 matrix as a row-major tensor, a transposed view
    of a row-major one, or a view with a row stride over its width."""
    if layout == "rows":
        return torch.randn(rows, cols, generator=g)
    if layout == "transposed":
        return torch.randn(cols, rows, generator=g).t()
    return torch.randn(rows, cols + 3, generator=g)[:, :cols]


@pytest.mark.parametrize("gemm", ["own", "aten"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("a_layout", ["rows", "transposed", "padded"])
@pytest.mark.parametrize("b_layout", ["rows", "transposed", "padded"])
@pytest.mark.parametrize("M,K,N", [(300, 8192, 40), (150, 70, 200), (3, 5, 7)])
def test_layer_mm_out_matches_float64(gemm, threads, a_layout, b_layout, M, K, N, monkeypatch):
    # K = 8192: blocks of 128 rows (4 MiB of a each); N = 40: one panel, so
    # two threads split the rows; N = 200: several panels and a remainder.
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", gemm)
    g = torch.Generator().manual_seed(M + K + N)
    a, b = _operand(M, K, a_layout, g), _operand(K, N, b_layout, g)
    start = torch.randn(M, N, generator=g)
    want = a.double() @ b.double()
    with num_threads(threads):
        out = torch.full((M, N), float("nan"))
        pipelstm._C._layer_mm_out(out, a, b)
        assert rel_error(out.double(), want) < 1e-5
        out = start.clone()
        pipelstm._C._layer_mm_out(out, a, b, accumulate=True)
        assert rel_error(out.double(), start.double() + want) < 1e-5


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,K", [(1030, 2048), (21, 37)])
def test_layer_mm_out_on_a_transposed_a_a_page_apart(threads, M, K, monkeypatch):
    # A weight gradient's grad_gates.t() at H >= 256: rows a page or more
    # apart in memory, made dense block by block first where the build has a
    # transpose (gemm_cpu.cpp). 1030 x 2048: blocks of 512 rows and a tail
    # of 6, rows not a multiple of the vector width; 21 x 37: edges only.
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", "own")
    g = torch.Generator().manual_seed(M)
    a = torch.randn(K, 1030, generator=g)[:, :M].t()
    assert a.stride(1) * 4 >= 4096
    b, start = torch.randn(K, 200, generator=g), torch.randn(M, 200, generator=g)
    want = a.double() @ b.double()
    with num_threads(threads):
        out = torch.full((M, 200), float("nan"))
        pipelstm._C._layer_mm_out(out, a, b)
        assert rel_error(out.double(), want) < 1e-5
        out = start.clone()
        pipelstm._C._layer_mm_out(out, a, b, accumulate=True)
        assert rel_error(out.double(), start.double() + want) < 1e-5


@pytest.mark.parametrize("gemm", ["own", "aten"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("M,N", [(150, 200), (5, 7)])
def test_layer_mm_out_over_an_empty_depth(gemm, transposed, M, N, monkeypatch):
    # K = 0, as in the weight gradients of a batch of no sequences: out is
    # zeros, or stays as it was when accumulating.
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", gemm)
    a = torch.empty(0, M).t() if transposed else torch.empty(M, 0)
    b = torch.empty(0, N)
    out = torch.full((M, N), float("nan"))
    pipelstm._C._layer_mm_out(out, a, b)
    assert torch.equal(out, torch.zeros(M, N))
    start = torch.randn(M, N)
    out = start.clone()
    pipelstm._C._layer_mm_out(out, a, b, accumulate=True)
    assert torch.equal(out, start)


def test_layer_mm_out_rejects_mismatched_shapes():
    with pytest.raises(RuntimeError, match="layer_mm_out: shapes"):
        pipelstm._C._layer_mm_out(torch.empty(3, 4), torch.empty(3, 5), torch.empty(6, 4))


@pytest.mark.parametrize("split", ["0", "1"])
@pytest.mark.parametrize("M,K,N", [(300, 8192, 40), (512, 4097, 128), (21, 37, 5), (7, 1, 3)])
def test_layer_mm_out_split_over_the_depth(split, M, K, N, monkeypatch):
    # A weight gradient on two threads split over the depth (gemm_cpu.cpp,
    # PIPELSTM_SPLIT_DEPTH=1 on any build): one half into out, the other
    # into a buffer added after; an odd depth and a depth of 1 (one thread's
    # slice empty) too; out with a row stride over its width.
    monkeypatch.setenv("PIPELSTM_CPU_GEMM", "own")
    monkeypatch.setenv("PIPELSTM_SPLIT_DEPTH", split)
    g = torch.Generator().manual_seed(M + K)
    a, b = torch.randn(K, M, generator=g).t(), torch.randn(K, N, generator=g)
    start = torch.randn(M, N, generator=g)
    want = a.double() @ b.double()
    with num_threads(2):
        out = torch.full((M, N + 3), float("nan"))[:, :N]
        pipelstm._C._layer_mm_out(out, a, b)
        assert rel_error(out.double(), want) < 1e-5
        out = torch.cat([start, torch.full((M, 3), float("nan"))], 1)[:, :N]
        pipelstm._C._layer_mm_out(out, a, b, accumulate=True)
        assert rel_error(out.double(), start.double() + want) < 1e-5
