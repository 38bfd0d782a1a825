#include "kernels_cuda.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include "../settings.h"
#include "pipelstm/kernels/lstm_persistent_cluster_cuda.h"
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

// A tensor-core launch, `launch(args, unit_tiles or blocks, stream, &fit)`,
// with the kernels' own split (0: every block on a multiprocessor of its
// own; a cluster's smallest that fits); false, having launched nothing,
// where the shape does not fit.
template <typename Args, typename Launch>
bool tc_launch(const Args& a, Launch launch) {
  kernels::TcFit fit = kernels::TcFit::kFits;
  C10_CUDA_CHECK(launch(in_storage(a), /*unit_tiles=*/0, at::cuda::getCurrentCUDAStream(), &fit));
  return fit == kernels::TcFit::kFits;
}

}  // namespace

// The cluster kernels where PIPELSTM_PERSISTENT_KERNEL asks for them and
// they fit (Hopper), else the grid kernels.
template <typename T>
bool persistent_tc_forward(const kernels::PersistentForwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  const std::string kernel = settings::persistent_kernel();
  if (kernel != "grid") {
    const auto sync = kernel == "cluster_async" ? kernels::cluster::Sync::kAsyncStores
                                                : kernels::cluster::Sync::kClusterBarrier;
    const auto launch = [sync](const kernels::PersistentForwardArgs<S>& args, int64_t blocks,
                               cudaStream_t stream, kernels::TcFit* fit) {
      return kernels::cluster_forward_cuda<S>(args, blocks, sync, stream, fit);
    };
    if (tc_launch(a, launch)) return true;
  }
  return tc_launch(a, kernels::tc_persistent_forward_cuda<S>);
}

template <typename T>
bool persistent_tc_backward(const kernels::PersistentBackwardArgs<T>& a) {
  using S = typename Storage<T>::type;
  if (settings::persistent_kernel() != "grid" && tc_launch(a, kernels::cluster_backward_cuda<S>)) return true;
  return tc_launch(a, kernels::tc_persistent_backward_cuda<S>);
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
