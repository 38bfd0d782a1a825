// CPU backend of the pointwise step: typed pointers, batch rows split over
// ATen's intra-op threads, and the op registrations for the CPU key.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "../device_kernels.h"
#include "../pointwise_backend.h"
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
  kernels::PointwiseForwardArgs<T> a;
  a.gates = static_cast<const T*>(s.gates);
  a.hidden_gates = static_cast<const T*>(s.hidden_gates);
  a.bias_ih = static_cast<const T*>(s.bias_ih);
  a.bias_hh = static_cast<const T*>(s.bias_hh);
  a.c_prev = static_cast<const T*>(s.c_prev);
  a.act_gates = static_cast<T*>(s.act_gates);
  a.c = static_cast<T*>(s.c);
  a.h = static_cast<T*>(s.h);
  a.batch = s.batch;
  a.hidden = s.hidden;
  at::parallel_for(0, s.batch, grain_rows(s.hidden), [&](int64_t b0, int64_t b1) {
    kernels::pointwise_forward_cpu<T>(a, b0, b1);
  });
}

template <typename T>
void backward_typed(const StepBackward& s) {
  kernels::PointwiseBackwardArgs<T> a;
  a.grad_h = static_cast<const T*>(s.grad_h);
  a.grad_c = static_cast<const T*>(s.grad_c);
  a.act_gates = static_cast<const T*>(s.act_gates);
  a.c_prev = static_cast<const T*>(s.c_prev);
  a.c = static_cast<const T*>(s.c);
  a.grad_gates = static_cast<T*>(s.grad_gates);
  a.grad_c_prev = static_cast<T*>(s.grad_c_prev);
  a.batch = s.batch;
  a.hidden = s.hidden;
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
