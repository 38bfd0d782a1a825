// CPU backend of the pointwise step: typed pointers, batch rows split over
// ATen's intra-op threads, and the op registrations for the CPU key.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "../device_kernels.h"
#include "../pointwise_backend.h"
#include "../step_args.h"
#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace {

// Rows per task: enough elements per thread to amortise the fork.
int64_t grain_rows(int64_t hidden) {
  constexpr int64_t kElementsPerTask = 16384;
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, 4 * hidden));
}

template <typename T>
void forward_typed(const StepForward& s) {
  const auto a = typed_args<T>(s);
  at::parallel_for(0, s.batch, grain_rows(s.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_forward_cpu<T>(a, b0, b1);
  });
}

template <typename T>
void backward_typed(const StepBackward& s) {
  const auto a = typed_args<T>(s);
  at::parallel_for(0, s.batch, grain_rows(s.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_backward_cpu<T>(a, b0, b1);
  });
}

void forward_cpu(at::ScalarType dtype, const StepForward& s) {
  switch (dtype) {
    case at::kFloat: return forward_typed<float>(s);
    case at::kDouble: return forward_typed<double>(s);
    default: TORCH_CHECK(false, "pipelstm: no CPU pointwise kernel for ", dtype);
  }
}

void backward_cpu(at::ScalarType dtype, const StepBackward& s) {
  switch (dtype) {
    case at::kFloat: return backward_typed<float>(s);
    case at::kDouble: return backward_typed<double>(s);
    default: TORCH_CHECK(false, "pipelstm: no CPU pointwise kernel for ", dtype);
  }
}

const bool registered = [] {
  register_pointwise_backend(c10::DeviceType::CPU, {&forward_cpu, &backward_cpu});
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CPU, m) {
  register_device_kernels(m);
}

}  // namespace pipelstm
