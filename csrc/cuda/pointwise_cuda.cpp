#include "pointwise_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "pipelstm/kernels/lstm_pointwise_cuda.h"
#include "storage_types_cuda.h"

namespace pipelstm {
namespace cuda {

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

#define PIPELSTM_INSTANTIATE_STEP(T)                                              \
  template void pointwise_forward<T>(const kernels::PointwiseForwardArgs<T>&);   \
  template void pointwise_backward<T>(const kernels::PointwiseBackwardArgs<T>&);
PIPELSTM_INSTANTIATE_STEP(float)
PIPELSTM_INSTANTIATE_STEP(double)
PIPELSTM_INSTANTIATE_STEP(c10::Half)
PIPELSTM_INSTANTIATE_STEP(c10::BFloat16)
#undef PIPELSTM_INSTANTIATE_STEP

}  // namespace cuda
}  // namespace pipelstm
