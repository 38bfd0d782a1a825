#include "persistent_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include "pipelstm/kernels/lstm_persistent_cuda.h"
#include "pipelstm/kernels/lstm_persistent_tc_cuda.h"
#include "storage_types_cuda.h"

namespace pipelstm {
namespace cuda {
namespace {

template <typename T, typename S = typename Storage<T>::type>
kernels::PersistentForwardArgs<S> in_storage(const kernels::PersistentForwardArgs<T>& a) {
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
  return s;
}

template <typename T, typename S = typename Storage<T>::type>
kernels::PersistentBackwardArgs<S> in_storage(const kernels::PersistentBackwardArgs<T>& a) {
  kernels::PersistentBackwardArgs<S> s;
  s.grad_output = as<S>(a.grad_output);
  s.grad_h_n = as<S>(a.grad_h_n);
  s.grad_c_n = as<S>(a.grad_c_n);
  s.w_hh = as<S>(a.w_hh);
  s.c0 = as<S>(a.c0);
  s.act_gates = as<S>(a.act_gates);
  s.cells = as<S>(a.cells);
  s.grad_gates = as<S>(a.grad_gates);
  s.grad_h0 = as<S>(a.grad_h0);
  s.grad_c0 = as<S>(a.grad_c0);
  s.steps = a.steps;
  s.batch = a.batch;
  s.hidden = a.hidden;
  s.reverse = a.reverse;
  return s;
}

}  // namespace

template <typename T>
bool persistent_forward(const kernels::PersistentForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  if (!kernels::persistent_forward_fits<S>(a.hidden, c10::cuda::current_device())) return false;
  C10_CUDA_CHECK(kernels::persistent_forward_cuda<S>(in_storage(a), at::cuda::getCurrentCUDAStream()));
  return true;
}

// unit_tiles 0: the kernels' own split, every block on a multiprocessor of its own.
template <typename T>
bool persistent_tc_forward(const kernels::PersistentForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  kernels::TcFit fit = kernels::TcFit::kFits;
  C10_CUDA_CHECK(kernels::tc_persistent_forward_cuda<S>(in_storage(a), /*unit_tiles=*/0,
                                                        at::cuda::getCurrentCUDAStream(), &fit));
  return fit == kernels::TcFit::kFits;
}

template <typename T>
bool persistent_tc_backward(const kernels::PersistentBackwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  kernels::TcFit fit = kernels::TcFit::kFits;
  C10_CUDA_CHECK(kernels::tc_persistent_backward_cuda<S>(in_storage(a), /*unit_tiles=*/0,
                                                         at::cuda::getCurrentCUDAStream(), &fit));
  return fit == kernels::TcFit::kFits;
}

template bool persistent_forward<float>(const kernels::PersistentForwardArgs<float>&);
template bool persistent_forward<c10::Half>(const kernels::PersistentForwardArgs<c10::Half>&);
template bool persistent_forward<c10::BFloat16>(const kernels::PersistentForwardArgs<c10::BFloat16>&);
template bool persistent_tc_forward<c10::Half>(const kernels::PersistentForwardArgs<c10::Half>&);
template bool persistent_tc_forward<c10::BFloat16>(const kernels::PersistentForwardArgs<c10::BFloat16>&);
template bool persistent_tc_backward<c10::Half>(const kernels::PersistentBackwardArgs<c10::Half>&);
template bool persistent_tc_backward<c10::BFloat16>(const kernels::PersistentBackwardArgs<c10::BFloat16>&);

}  // namespace cuda
}  // namespace pipelstm
