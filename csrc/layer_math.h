// The GEMMs and buffers that a layer op's device-generic parts compute with
// (the step loop, the weight gradients), given by whoever knows the device:
// a backend's layer class (CpuLayer::kMath, CudaLayer::kMath) after the
// dispatcher chose it, or backend.h's front doors in device-generic callers
// (the pipeline's units).
#pragma once

#include <ATen/core/Tensor.h>

namespace pipelstm {

struct LayerMath {
  // out = a @ b, or out += a @ b with `accumulate`; out [M, N] with unit
  // column stride, a [M, K] and b [K, N] with any strides.
  void (*mm_out)(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);
  // a @ b as a new tensor.
  at::Tensor (*mm)(const at::Tensor& a, const at::Tensor& b);
  // An uninitialised tensor for a large result or workspace.
  at::Tensor (*empty)(at::IntArrayRef sizes, const at::TensorOptions& options);
};

}  // namespace pipelstm
