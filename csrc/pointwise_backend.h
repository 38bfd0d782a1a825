// The fused pointwise step behind a per-device function table.
//
// The layer and cell ops are written once against this interface; each
// backend (cpu/, cuda/) registers its implementation at load time, so a
// CPU-only build simply has no CUDA entry and needs no #ifdef.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

namespace pipelstm {

// Untyped views of one step's buffers; see kernels/.../lstm_pointwise.h for
// the layouts. Optional pointers may be null.
struct StepForward {
  const void* gates = nullptr;
  const void* hidden_gates = nullptr;
  const void* bias_ih = nullptr;
  const void* bias_hh = nullptr;
  const void* c_prev = nullptr;
  void* act_gates = nullptr;
  void* c = nullptr;
  void* h = nullptr;
  int64_t batch = 0;
  int64_t hidden = 0;
};

struct StepBackward {
  const void* grad_h = nullptr;
  const void* grad_c = nullptr;
  const void* act_gates = nullptr;
  const void* c_prev = nullptr;
  const void* c = nullptr;
  void* grad_gates = nullptr;
  void* grad_c_prev = nullptr;
  int64_t batch = 0;
  int64_t hidden = 0;
};

// A whole dense sequence in one persistent kernel (no projection); see
// kernels/.../lstm_persistent.h for the layouts.
struct SequenceForward {
  const void* input_gates = nullptr;
  const void* w_hh = nullptr;
  const void* h0 = nullptr;
  const void* c0 = nullptr;
  void* output = nullptr;
  void* act_gates = nullptr;
  void* cells = nullptr;
  int64_t steps = 0;
  int64_t batch = 0;
  int64_t hidden = 0;
  bool reverse = false;
};

struct PointwiseBackend {
  void (*forward)(at::ScalarType dtype, const StepForward& step) = nullptr;
  void (*backward)(at::ScalarType dtype, const StepBackward& step) = nullptr;
  // Optional: runs the whole sequence and returns true, or returns false
  // (nothing done) when the kernel does not fit this dtype or size.
  bool (*sequence_forward)(at::ScalarType dtype, const SequenceForward& seq) = nullptr;
};

// Called once by each backend from a static initializer.
void register_pointwise_backend(c10::DeviceType device, PointwiseBackend backend);

// The backend for `device`; raises if none was built.
const PointwiseBackend& pointwise_backend(c10::DeviceType device);

// Pointer to the data of an optional tensor, or null.
inline const void* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr() : nullptr;
}

}  // namespace pipelstm
