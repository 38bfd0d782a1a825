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
#include "pipelstm/kernels/lstm_persistent_cuda.h"
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

template <typename T>
bool sequence_typed(const SequenceForward& s) {
  if (!kernels::persistent_forward_fits<T>(s.hidden, c10::cuda::current_device())) return false;
  kernels::PersistentForwardArgs<T> a;
  a.input_gates = static_cast<const T*>(s.input_gates);
  a.w_hh = static_cast<const T*>(s.w_hh);
  a.h0 = static_cast<const T*>(s.h0);
  a.c0 = static_cast<const T*>(s.c0);
  a.output = static_cast<T*>(s.output);
  a.act_gates = static_cast<T*>(s.act_gates);
  a.cells = static_cast<T*>(s.cells);
  a.steps = s.steps;
  a.batch = s.batch;
  a.hidden = s.hidden;
  a.reverse = s.reverse;
  C10_CUDA_CHECK(kernels::persistent_forward_cuda<T>(a, at::cuda::getCurrentCUDAStream()));
  return true;
}

bool sequence_forward_cuda(at::ScalarType dtype, const SequenceForward& s) {
  switch (dtype) {
    case at::kFloat: return sequence_typed<float>(s);
    case at::kHalf: return sequence_typed<__half>(s);
    case at::kBFloat16: return sequence_typed<__nv_bfloat16>(s);
    default: return false;
  }
}

const bool registered = [] {
  register_pointwise_backend(c10::DeviceType::CUDA,
                             {&forward_cuda, &backward_cuda, &sequence_forward_cuda});
  return true;
}();

}  // namespace

TORCH_LIBRARY_IMPL(pipelstm, CUDA, m) {
  register_device_kernels(m);
}

}  // namespace pipelstm
