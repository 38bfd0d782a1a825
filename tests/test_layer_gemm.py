"""The LSTM layers' GEMMs (csrc/layer_gemm.h, csrc/column_major_gemm.h).

On CUDA a float32 layer's GEMMs take the precision nn.LSTM's cuDNN path
takes: TF32 exactly while ``torch.backends.cudnn.allow_tf32`` (cuDNN's RNN
precision) allows it, whatever ``torch.backends.cuda.matmul.allow_tf32``
says. The policy is checked here, on any machine; its numerics on a GPU in
tests/gpu/test_gpu_tf32.py.

cuBLAS is column-major: how a row-major ``out = a @ b`` of any strides is
handed to it is plain arithmetic, checked here by running the very call it
plans as a column-major GEMM over the tensors' storage.
"""

import itertools

import pytest
import torch

import pipelstm

tf32 = pipelstm._C._layer_gemm_tf32


@pytest.fixture
def restore_precision_flags():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("matmul", [False, True])
def test_cuda_float32_follows_cudnn_allow_tf32_not_matmul(restore_precision_flags, matmul):
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = True
    assert tf32("cuda", torch.float32)
    torch.backends.cudnn.allow_tf32 = False
    assert not tf32("cuda", torch.float32)


def test_cudnn_rnn_precision_setting_is_followed(restore_precision_flags):
    # The finer switch of torch's precision API, read by cuDNN's RNNs too.
    rnn = torch.backends.cudnn.rnn
    saved = rnn.fp32_precision
    try:
        torch.backends.cudnn.allow_tf32 = True
        rnn.fp32_precision = "ieee"
        assert not tf32("cuda", torch.float32)
        rnn.fp32_precision = "tf32"
        assert tf32("cuda", torch.float32)
    finally:
        rnn.fp32_precision = saved


def test_torch_defaults_mean_tf32_on_cuda_and_never_elsewhere(restore_precision_flags):
    # torch's defaults: cudnn.allow_tf32 on, matmul.allow_tf32 off.
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
    assert tf32("cuda", torch.float32)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert not tf32("cuda", dtype)
    assert not tf32("cpu", torch.float32)


def _layouts(rows, cols, g):
    """[rows, cols] float64 matrices in every layout a layer hands its GEMMs
    and some it does not: row-major, transposed, inside a wider buffer either
    way, and (None expected) every other element."""
    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    yield "row-major", rand(rows, cols), True
    yield "transposed", rand(cols, rows).t(), True
    yield "row-major in a wider buffer", rand(rows, cols + 3)[:, 1:cols + 1], True
    yield "transposed in a wider buffer", rand(cols, rows + 2)[:, 2:].t(), True
    # A vector's one stride is all there is to read: only a matrix is copied.
    yield "every other element", rand(2 * rows, 2 * cols)[::2, ::2], rows == 1 or cols == 1


def _run_as_column_major(plan, out, a, b):
    """out = a @ b computed the way the planned cuBLAS call does: C = op(A)
    op(B), column-major, A read from b's storage and B from a's."""
    trans_a, trans_b, m, n, k, lda, ldb, ldc = plan
    # cuBLAS rejects a leading dimension below the rows of what is stored.
    assert lda >= max(1, k if trans_a else m) and ldb >= max(1, n if trans_b else k) and ldc >= max(1, m)

    def col_major(t, r, c, ld):
        return torch.as_strided(t, (r, c), (1, ld), t.storage_offset())
    A = col_major(b, *((k, m) if trans_a else (m, k)), lda)
    B = col_major(a, *((n, k) if trans_b else (k, n)), ldb)
    col_major(out, m, n, ldc).copy_((A.t() if trans_a else A) @ (B.t() if trans_b else B))


@pytest.mark.parametrize("M,N,K", list(itertools.product([1, 3, 7], repeat=3)))
def test_the_planned_column_major_call_computes_a_at_b(M, N, K):
    g = torch.Generator().manual_seed(M * 100 + N * 10 + K)
    outs = [("out row-major", torch.zeros(M, N, dtype=torch.float64)),
            ("out in a wider buffer", torch.zeros(M, N + 2, dtype=torch.float64)[:, 1:N + 1])]
    for (an, a, a_ok), (bn, b, b_ok), (on, out) in itertools.product(
            _layouts(M, K, g), _layouts(K, N, g), outs):
        plan = pipelstm._C._column_major_gemm(M, N, K, list(out.stride()), list(a.stride()), list(b.stride()))
        if not (a_ok and b_ok):
            assert plan is None, f"{an} @ {bn}: a layout no BLAS reads in place must be copied"
            continue
        assert plan is not None, f"{an} @ {bn} into {on}"
        out.zero_()
        _run_as_column_major(plan, out, a, b)
        torch.testing.assert_close(out, a @ b, msg=f"{an} @ {bn} into {on}: {plan}")


def test_a_column_major_out_is_not_written_in_place():
    out = torch.zeros(4, 3, dtype=torch.float64).t()
    assert pipelstm._C._column_major_gemm(3, 4, 2, list(out.stride()), [2, 1], [4, 1]) is None
