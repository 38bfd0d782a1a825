#include "kernels_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "pipelstm/kernels/lstm_pointwise_cuda.h"
#include "storage_types_cuda.h"

namespace pipelstm {
namespace cuda {

template <typename T>
void pointwise_forward(const kernels::PointwiseForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  C10_CUDA_CHECK(kernels::pointwise_forward_cuda<S>(in_storage(a), at::cuda::getCurrentCUDAStream()));
}

template <typename T>
void pointwise_backward(const kernels::PointwiseBackwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  C10_CUDA_CHECK(kernels::pointwise_backward_cuda<S>(in_storage(a), at::cuda::getCurrentCUDAStream()));
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
