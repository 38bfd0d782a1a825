// CUDA kernels of the LayerNorm LSTM's rows: one block a row, the phases of
// layernorm_lstm_rows_indexing.h (which the host harness checks against
// the CPU rows) separated by sums over the block. Optional pointers become
// template flags, as in the pointwise kernels.
#include "pipelstm/kernels/layernorm_lstm_rows_cuda.h"

#include "pipelstm/kernels/flag_dispatch.h"
#include "pipelstm/kernels/layernorm_lstm_rows_indexing.h"

namespace pipelstm {
namespace kernels {
namespace {

namespace li = layernorm_indexing;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The sum over the block of every thread's `part`, the same on every
// thread. The warps' totals are added in warp order by every thread, so the
// result does not depend on scheduling. Ends with a barrier, so `scratch`
// may be written again at once.
template <typename T>
__device__ T block_sum(T part, T* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) part += __shfl_down_sync(0xffffffffu, part, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = part;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

template <typename T>
__device__ li::Sums<T> block_sums(li::Sums<T> part, T* scratch) {
  return {block_sum(part.first, scratch), block_sum(part.second, scratch)};
}

template <typename T>
__global__ void __launch_bounds__(kThreads) norm_rows_kernel(T* x, T* rstd, int64_t n, T eps) {
  __shared__ T scratch[kWarps];
  const int rank = threadIdx.x;
  T* row = x + int64_t(blockIdx.x) * n;
  const T mean = block_sum(li::row_sum(row, n, rank, kThreads), scratch) / T(n);
  const T r = li::rstd_of(block_sum(li::row_deviation(row, n, mean, rank, kThreads), scratch), n, eps);
  li::row_normalise(row, n, mean, r, rank, kThreads);
  if (rank == 0) rstd[blockIdx.x] = r;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    norm_backward_rows_kernel(T* grad, const T* x_hat, const T* rstd, int64_t n) {
  __shared__ T scratch[kWarps];
  const int rank = threadIdx.x;
  const int64_t at = int64_t(blockIdx.x) * n;
  const li::Sums<T> s = block_sums(li::row_grad_sums(grad + at, x_hat + at, n, rank, kThreads), scratch);
  li::row_grad_apply(grad + at, x_hat + at, n, rstd[blockIdx.x], s, rank, kThreads);
}

template <typename T, bool kBias, bool kBeta, bool kZoneout>
__global__ void __launch_bounds__(kThreads) step_forward_kernel(const LayerNormStepForwardArgs<T> a) {
  __shared__ T scratch[kWarps];
  const int rank = threadIdx.x;
  const int64_t b = blockIdx.x, G = 4 * a.hidden;
  const T* r = a.r + b * G;
  const T r_mean = block_sum(li::row_sum(r, G, rank, kThreads), scratch) / T(G);
  const T r_rstd = li::rstd_of(block_sum(li::row_deviation(r, G, r_mean, rank, kThreads), scratch), G, a.eps);
  const T c_mean =
      block_sum(li::forward_gates<T, kBias>(a, b, r_mean, r_rstd, rank, kThreads), scratch) / T(a.hidden);
  const T c_rstd =
      li::rstd_of(block_sum(li::cell_deviation(a, b, c_mean, rank, kThreads), scratch), a.hidden, a.eps);
  li::forward_finish<T, kBeta, kZoneout>(a, b, c_mean, c_rstd, r_rstd, rank, kThreads);
}

template <typename T, bool kGradOut, bool kZoneout>
__global__ void __launch_bounds__(kThreads) step_backward_kernel(const LayerNormStepBackwardArgs<T> a) {
  __shared__ T scratch[kWarps];
  const int rank = threadIdx.x;
  const int64_t b = blockIdx.x;
  const li::Sums<T> cell = block_sums(li::backward_cell<T, kGradOut, kZoneout>(a, b, rank, kThreads), scratch);
  const li::Sums<T> recurrent =
      block_sums(li::backward_gates<T, kGradOut, kZoneout>(a, b, cell, rank, kThreads), scratch);
  li::backward_recurrent(a, b, recurrent, rank, kThreads);
}

// kernel<<<rows, kThreads>>>(args...) on `stream`: one block a row; no rows
// launch nothing (an empty grid is a launch error), too many are refused.
template <class Kernel, class... Args>
cudaError_t launch_rows(int64_t rows, cudaStream_t stream, Kernel kernel, const Args&... args) {
  if (rows <= 0) return cudaSuccess;
  if (rows > int64_t(0x7fffffff)) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t layer_norm_rows_cuda(T* x, T* rstd, int64_t n, T eps, int64_t rows, cudaStream_t stream) {
  return launch_rows(n > 0 ? rows : 0, stream, norm_rows_kernel<T>, x, rstd, n, eps);
}

template <typename T>
cudaError_t layer_norm_backward_rows_cuda(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t rows,
                                          cudaStream_t stream) {
  return launch_rows(n > 0 ? rows : 0, stream, norm_backward_rows_kernel<T>, grad, x_hat, rstd, n);
}

template <typename T>
cudaError_t layernorm_step_forward_cuda(const LayerNormStepForwardArgs<T>& a, cudaStream_t stream) {
  return with_flags(
      [&](auto bias, auto beta, auto zoned) {
        return launch_rows(a.hidden > 0 ? a.batch : 0, stream,
                           step_forward_kernel<T, decltype(bias)::value, decltype(beta)::value, decltype(zoned)::value>,
                           a);
      },
      a.bias != nullptr, a.beta_c != nullptr, a.keep.on());
}

template <typename T>
cudaError_t layernorm_step_backward_cuda(const LayerNormStepBackwardArgs<T>& a, cudaStream_t stream) {
  return with_flags(
      [&](auto out, auto zoned) {
        return launch_rows(a.hidden > 0 ? a.batch : 0, stream,
                           step_backward_kernel<T, decltype(out)::value, decltype(zoned)::value>, a);
      },
      a.grad_out != nullptr, a.keep.on());
}

#define PIPELSTM_INSTANTIATE_LAYERNORM_ROWS(T)                                                                  \
  template cudaError_t layer_norm_rows_cuda<T>(T*, T*, int64_t, T, int64_t, cudaStream_t);                    \
  template cudaError_t layer_norm_backward_rows_cuda<T>(T*, const T*, const T*, int64_t, int64_t,             \
                                                        cudaStream_t);                                        \
  template cudaError_t layernorm_step_forward_cuda<T>(const LayerNormStepForwardArgs<T>&, cudaStream_t);      \
  template cudaError_t layernorm_step_backward_cuda<T>(const LayerNormStepBackwardArgs<T>&, cudaStream_t);

PIPELSTM_INSTANTIATE_LAYERNORM_ROWS(float)
PIPELSTM_INSTANTIATE_LAYERNORM_ROWS(double)

#undef PIPELSTM_INSTANTIATE_LAYERNORM_ROWS

}  // namespace kernels
}  // namespace pipelstm
