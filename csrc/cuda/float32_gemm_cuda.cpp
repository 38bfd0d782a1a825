// The LSTM layers' float32 GEMMs on CUDA (layer_gemm.h): cuBLAS called with
// the compute type the layer's precision policy asks for, TF32 tensor cores
// or exact float32, on the current stream with ATen's handle and workspace
// (so the call is capturable in a CUDA graph). Compiled only in a CUDA build.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/util/Exception.h>
#include <cublas_v2.h>

#include <limits>

#include "../column_major_gemm.h"
#include "../layer_gemm.h"

namespace pipelstm {
namespace {

// A tensor's layout for cuBLAS, with `t` replaced by a contiguous copy where
// its strides have none.
MatrixLayout readable(at::Tensor& t) {
  if (auto l = blas_layout(t.size(0), t.size(1), t.stride(0), t.stride(1))) return *l;
  t = t.contiguous();
  return *blas_layout(t.size(0), t.size(1), t.stride(0), t.stride(1));
}

int as_int(int64_t v, const char* what) {
  TORCH_CHECK(v <= std::numeric_limits<int>::max(), "pipelstm: a layer GEMM's ", what, " (", v,
              ") is beyond cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

void float32_mm_out(const at::Tensor& out, const at::Tensor& a_in, const at::Tensor& b_in,
                    bool accumulate, bool tf32) {
  TORCH_CHECK(out.is_cuda() && a_in.is_cuda() && b_in.is_cuda() && out.scalar_type() == at::kFloat &&
                  a_in.scalar_type() == at::kFloat && b_in.scalar_type() == at::kFloat,
              "pipelstm: the CUDA float32 layer GEMM takes CUDA float32 tensors");
  const int64_t M = a_in.size(0), K = a_in.size(1), N = b_in.size(1);
  if (M == 0 || N == 0) return;
  at::Tensor& o = const_cast<at::Tensor&>(out);
  if (K == 0) {  // an empty sum
    if (!accumulate) o.zero_();
    return;
  }
  // The result goes where cuBLAS can write it row-major in place: out
  // itself, or a contiguous stand-in copied back after.
  const auto out_layout = blas_layout(M, N, out.stride(0), out.stride(1));
  const bool in_place = out_layout.has_value() && out_layout->row_major;
  at::Tensor c = in_place ? o : (accumulate ? o.contiguous() : at::empty({M, N}, o.options()));
  const MatrixLayout c_layout = in_place ? *out_layout : MatrixLayout{true, std::max<int64_t>(1, N)};
  at::Tensor a = a_in, b = b_in;
  const MatrixLayout la = readable(a), lb = readable(b);
  const ColumnMajorGemm g = column_major_gemm(M, N, K, c_layout, la, lb);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  // The handle's math mode (ATen sets it from the matmul switch each time it
  // hands the handle out) also governs a GemmEx of COMPUTE_32F: set both.
  TORCH_CUDABLAS_CHECK(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  TORCH_CUDABLAS_CHECK(cublasGemmEx(
      handle, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      as_int(g.m, "N"), as_int(g.n, "M"), as_int(g.k, "K"), &alpha, b.const_data_ptr<float>(), CUDA_R_32F,
      as_int(g.lda, "leading dimension"), a.const_data_ptr<float>(), CUDA_R_32F,
      as_int(g.ldb, "leading dimension"), &beta, c.mutable_data_ptr<float>(), CUDA_R_32F,
      as_int(g.ldc, "leading dimension"), tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
  if (!in_place) o.copy_(c);
}

const bool registered = (register_float32_gemm(c10::DeviceType::CUDA, &float32_mm_out), true);

}  // namespace
}  // namespace pipelstm
