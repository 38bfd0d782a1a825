// CPU entries of the pointwise step: batch rows split over ATen's intra-op
// threads; and the op registrations for the CPU key.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "../device_kernels.h"
#include "../pointwise_step.h"
#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace {

// Rows per task: enough elements per thread to amortise the fork.
int64_t grain_rows(int64_t hidden) {
  constexpr int64_t kElementsPerTask = 16384;
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, 4 * hidden));
}

template <typename T>
void forward(const kernels::PointwiseForwardArgs<T>& a) {
  at::parallel_for(0, a.batch, grain_rows(a.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_forward_cpu<T>(a, b0, b1);
  });
}

template <typename T>
void backward(const kernels::PointwiseBackwardArgs<T>& a) {
  at::parallel_for(0, a.batch, grain_rows(a.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_backward_cpu<T>(a, b0, b1);
  });
}

const bool registered = [] {
  register_pointwise_step<float>(c10::DeviceType::CPU, {&forward<float>, &backward<float>});
  register_pointwise_step<double>(c10::DeviceType::CPU, {&forward<double>, &backward<double>});
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CPU, m) {
  register_device_kernels(m);
}

}  // namespace pipelstm
