// The LayerNorm LSTM layer ops on CUDA (float32 and float64): the loop of
// layernorm_layer_loop.h on the row kernels of layernorm_lstm_rows_cuda.h
// (one block a row) and the layer GEMMs (layer_math_cuda.h). float16 and
// bfloat16 run the op's composition (python/pipelstm/layernorm_ops.py).
// Compiled only in a CUDA build.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../layernorm_layer_loop.h"
#include "layer_math_cuda.h"
#include "pipelstm/kernels/layernorm_lstm_rows_cuda.h"

namespace pipelstm {
namespace {

struct CudaLayerNorm {
  static constexpr const LayerMath& kMath = cuda::kLayerMath;

  static Tensor recurrent(const Tensor& w, int64_t) { return w; }
  static void recurrent_mm_out(const Tensor& out, const Tensor& a, const Tensor& w, bool accumulate) {
    kMath.mm_out(out, a, w, accumulate);
  }

  template <typename T>
  static void layer_norm_rows(T* x, T* rstd, int64_t n, T eps, int64_t rows) {
    C10_CUDA_CHECK(kernels::layer_norm_rows_cuda<T>(x, rstd, n, eps, rows, at::cuda::getCurrentCUDAStream()));
  }
  template <typename T>
  static void layer_norm_backward_rows(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t rows) {
    C10_CUDA_CHECK(
        kernels::layer_norm_backward_rows_cuda<T>(grad, x_hat, rstd, n, rows, at::cuda::getCurrentCUDAStream()));
  }
  template <typename T>
  static void step_forward(const kernels::LayerNormStepForwardArgs<T>& a) {
    C10_CUDA_CHECK(kernels::layernorm_step_forward_cuda<T>(a, at::cuda::getCurrentCUDAStream()));
  }
  template <typename T>
  static void step_backward(const kernels::LayerNormStepBackwardArgs<T>& a) {
    C10_CUDA_CHECK(kernels::layernorm_step_backward_cuda<T>(a, at::cuda::getCurrentCUDAStream()));
  }
  // ATen's reductions over the rows (the CPU's one pass has no GPU form).
  static std::tuple<Tensor, Tensor, Tensor> column_sums(const Tensor& a, const Tensor& b, const OptTensor& b2) {
    Tensor ab2 = b2.has_value() ? (a * *b2).sum(0) : at::zeros({0}, a.options());
    return {(a * b).sum(0), ab2, a.sum(0)};
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CUDA, m) {
  m.impl("lstm_layernorm_layer_forward", &layernorm::layernorm_forward<CudaLayerNorm>);
  m.impl("lstm_layernorm_layer_backward", &layernorm::layernorm_backward<CudaLayerNorm>);
}

}  // namespace pipelstm
