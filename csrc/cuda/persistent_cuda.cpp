#include "kernels_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include "pipelstm/kernels/lstm_persistent_cuda.h"
#include "pipelstm/kernels/lstm_persistent_tc_cuda.h"
#include "storage_types_cuda.h"

namespace pipelstm {
namespace cuda {
template <typename T>
bool persistent_forward(const kernels::PersistentForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  if (!kernels::persistent_forward_fits<S>(a.hidden, c10::cuda::current_device())) return false;
  C10_CUDA_CHECK(kernels::persistent_forward_cuda<S>(in_storage(a), at::cuda::getCurrentCUDAStream()));
  return true;
}

namespace {

// A tensor-core launch, `launch(args, unit_tiles, stream, &fit)`, with the
// kernels' own split (unit_tiles 0: every block on a multiprocessor of its
// own); false, having launched nothing, where the shape does not fit.
template <typename Args, typename Launch>
bool tc_launch(const Args& a, Launch launch) {
  kernels::TcFit fit = kernels::TcFit::kFits;
  C10_CUDA_CHECK(launch(in_storage(a), /*unit_tiles=*/0, at::cuda::getCurrentCUDAStream(), &fit));
  return fit == kernels::TcFit::kFits;
}

}  // namespace

template <typename T>
bool persistent_tc_forward(const kernels::PersistentForwardArgs<T>& a) {
  return tc_launch(a, kernels::tc_persistent_forward_cuda<typename Storage<T>::type>);
}

template <typename T>
bool persistent_tc_backward(const kernels::PersistentBackwardArgs<T>& a) {
  return tc_launch(a, kernels::tc_persistent_backward_cuda<typename Storage<T>::type>);
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
