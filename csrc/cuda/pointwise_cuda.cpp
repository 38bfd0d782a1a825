// CUDA backend of the pointwise step: typed pointers, one launch on the
// current stream (no host synchronisation, so the layer ops are capturable
// in a CUDA graph), the launch error turned into torch's error, and the op
// registrations for the CUDA key. Compiled only in a CUDA build.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "../device_kernels.h"
#include "../pointwise_backend.h"
#include "../step_args.h"
#include "pipelstm/kernels/lstm_pointwise_cuda.h"

namespace pipelstm {
namespace {

template <typename T>
void forward_typed(const StepForward& s) {
  const auto a = typed_args<T>(s);
  C10_CUDA_CHECK(kernels::pointwise_forward_cuda<T>(a, at::cuda::getCurrentCUDAStream()));
}

template <typename T>
void backward_typed(const StepBackward& s) {
  const auto a = typed_args<T>(s);
  C10_CUDA_CHECK(kernels::pointwise_backward_cuda<T>(a, at::cuda::getCurrentCUDAStream()));
}

void forward_cuda(at::ScalarType dtype, const StepForward& s) {
  switch (dtype) {
    case at::kFloat: return forward_typed<float>(s);
    case at::kDouble: return forward_typed<double>(s);
    case at::kHalf: return forward_typed<__half>(s);
    case at::kBFloat16: return forward_typed<__nv_bfloat16>(s);
    default: TORCH_CHECK(false, "pipelstm: no CUDA pointwise kernel for ", dtype);
  }
}

void backward_cuda(at::ScalarType dtype, const StepBackward& s) {
  switch (dtype) {
    case at::kFloat: return backward_typed<float>(s);
    case at::kDouble: return backward_typed<double>(s);
    case at::kHalf: return backward_typed<__half>(s);
    case at::kBFloat16: return backward_typed<__nv_bfloat16>(s);
    default: TORCH_CHECK(false, "pipelstm: no CUDA pointwise kernel for ", dtype);
  }
}

const bool registered = [] {
  register_pointwise_backend(c10::DeviceType::CUDA, {&forward_cuda, &backward_cuda});
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CUDA, m) {
  register_device_kernels(m);
}

}  // namespace pipelstm
