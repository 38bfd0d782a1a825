#include "pointwise_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace pipelstm {
namespace cpu {
namespace {

// Rows per task: enough elements per thread to amortise the fork.
int64_t grain_rows(int64_t hidden) {
  constexpr int64_t kElementsPerTask = 16384;
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, 4 * hidden));
}

}  // namespace

template <typename T>
void pointwise_forward(const kernels::PointwiseForwardArgs<T>& a) {
  at::parallel_for(0, a.batch, grain_rows(a.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_forward_cpu<T>(a, b0, b1);
  });
}

template <typename T>
void pointwise_backward(const kernels::PointwiseBackwardArgs<T>& a) {
  at::parallel_for(0, a.batch, grain_rows(a.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_backward_cpu<T>(a, b0, b1);
  });
}

template void pointwise_forward<float>(const kernels::PointwiseForwardArgs<float>&);
template void pointwise_forward<double>(const kernels::PointwiseForwardArgs<double>&);
template void pointwise_backward<float>(const kernels::PointwiseBackwardArgs<float>&);
template void pointwise_backward<double>(const kernels::PointwiseBackwardArgs<double>&);

}  // namespace cpu
}  // namespace pipelstm
