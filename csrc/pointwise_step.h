// The fused pointwise step as the ops see it: one typed entry per (device,
// dtype).
//
// An op dispatches on its dtype once (AT_DISPATCH, outside its time loop)
// and then calls `pointwise_step<T>(device)` with the kernel library's typed
// arguments (kernels/.../lstm_pointwise.h). Each backend (cpu/, cuda/)
// registers the entries it has at load time, so a CPU-only build simply has
// no CUDA entries and needs no #ifdef. `T` is ATen's element type (float,
// double, c10::Half, c10::BFloat16).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <array>

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {

template <typename T>
struct PointwiseStep {
  void (*forward)(const kernels::PointwiseForwardArgs<T>&) = nullptr;
  void (*backward)(const kernels::PointwiseBackwardArgs<T>&) = nullptr;
  // Optional: runs a whole dense sequence in one persistent kernel and
  // returns true, or returns false (nothing done) when it does not fit.
  bool (*sequence_forward)(const kernels::PersistentForwardArgs<T>&) = nullptr;
};

namespace detail {
template <typename T>
std::array<PointwiseStep<T>, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>&
pointwise_steps() {
  static std::array<PointwiseStep<T>,
                    static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
      steps;
  return steps;
}
}  // namespace detail

// Called by each backend from a static initializer, once per dtype it has.
template <typename T>
void register_pointwise_step(c10::DeviceType device, PointwiseStep<T> step) {
  detail::pointwise_steps<T>()[static_cast<size_t>(device)] = step;
}

// The entry for (device, T); raises if this build has none.
template <typename T>
const PointwiseStep<T>& pointwise_step(c10::DeviceType device) {
  const auto& step = detail::pointwise_steps<T>()[static_cast<size_t>(device)];
  TORCH_CHECK(step.forward != nullptr && step.backward != nullptr,
              "pipelstm: no fused LSTM kernels for ", c10::CppTypeToScalarType<T>::value, " on ",
              device, " in this build");
  return step;
}

// The dtypes the pointwise step has on some device, for AT_DISPATCH.
#define PIPELSTM_DISPATCH_STEP_TYPES(dtype, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, name, __VA_ARGS__)

// Typed data of an optional tensor, or null.
template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}

}  // namespace pipelstm
