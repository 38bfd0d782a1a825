#include "pointwise_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "pipelstm/kernels/lstm_persistent_cuda.h"
#include "pipelstm/kernels/lstm_pointwise_cuda.h"

namespace pipelstm {
namespace cuda {
namespace {

// The kernel library's element type for ATen's: c10::Half and c10::BFloat16
// hold the same 16 bits as __half and __nv_bfloat16.
template <typename T> struct Storage { using type = T; };
template <> struct Storage<c10::Half> { using type = __half; };
template <> struct Storage<c10::BFloat16> { using type = __nv_bfloat16; };

template <typename S, typename T>
S* as(T* p) {
  static_assert(sizeof(S) == sizeof(T) && alignof(S) == alignof(T));
  return reinterpret_cast<S*>(p);
}
template <typename S, typename T>
const S* as(const T* p) {
  static_assert(sizeof(S) == sizeof(T) && alignof(S) == alignof(T));
  return reinterpret_cast<const S*>(p);
}

}  // namespace

template <typename T>
void pointwise_forward(const kernels::PointwiseForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  kernels::PointwiseForwardArgs<S> s;
  s.gates = as<S>(a.gates);
  s.hidden_gates = as<S>(a.hidden_gates);
  s.bias_ih = as<S>(a.bias_ih);
  s.bias_hh = as<S>(a.bias_hh);
  s.c_prev = as<S>(a.c_prev);
  s.act_gates = as<S>(a.act_gates);
  s.c = as<S>(a.c);
  s.h = as<S>(a.h);
  s.batch = a.batch;
  s.hidden = a.hidden;
  C10_CUDA_CHECK(kernels::pointwise_forward_cuda<S>(s, at::cuda::getCurrentCUDAStream()));
}

template <typename T>
void pointwise_backward(const kernels::PointwiseBackwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  kernels::PointwiseBackwardArgs<S> s;
  s.grad_h = as<S>(a.grad_h);
  s.grad_c = as<S>(a.grad_c);
  s.act_gates = as<S>(a.act_gates);
  s.c_prev = as<S>(a.c_prev);
  s.c = as<S>(a.c);
  s.grad_gates = as<S>(a.grad_gates);
  s.grad_c_prev = as<S>(a.grad_c_prev);
  s.batch = a.batch;
  s.hidden = a.hidden;
  C10_CUDA_CHECK(kernels::pointwise_backward_cuda<S>(s, at::cuda::getCurrentCUDAStream()));
}

template <typename T>
bool persistent_forward(const kernels::PersistentForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  if (!kernels::persistent_forward_fits<S>(a.hidden, c10::cuda::current_device())) return false;
  kernels::PersistentForwardArgs<S> s;
  s.input_gates = as<S>(a.input_gates);
  s.w_hh = as<S>(a.w_hh);
  s.h0 = as<S>(a.h0);
  s.c0 = as<S>(a.c0);
  s.output = as<S>(a.output);
  s.act_gates = as<S>(a.act_gates);
  s.cells = as<S>(a.cells);
  s.steps = a.steps;
  s.batch = a.batch;
  s.hidden = a.hidden;
  s.reverse = a.reverse;
  C10_CUDA_CHECK(kernels::persistent_forward_cuda<S>(s, at::cuda::getCurrentCUDAStream()));
  return true;
}

#define PIPELSTM_INSTANTIATE_STEP(T)                                              \
  template void pointwise_forward<T>(const kernels::PointwiseForwardArgs<T>&);   \
  template void pointwise_backward<T>(const kernels::PointwiseBackwardArgs<T>&);
PIPELSTM_INSTANTIATE_STEP(float)
PIPELSTM_INSTANTIATE_STEP(double)
PIPELSTM_INSTANTIATE_STEP(c10::Half)
PIPELSTM_INSTANTIATE_STEP(c10::BFloat16)
#undef PIPELSTM_INSTANTIATE_STEP
template bool persistent_forward<float>(const kernels::PersistentForwardArgs<float>&);
template bool persistent_forward<c10::Half>(const kernels::PersistentForwardArgs<c10::Half>&);
template bool persistent_forward<c10::BFloat16>(const kernels::PersistentForwardArgs<c10::BFloat16>&);

}  // namespace cuda
}  // namespace pipelstm
