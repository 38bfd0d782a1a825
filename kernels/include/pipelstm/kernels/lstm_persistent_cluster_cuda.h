// CUDA entry points of the cluster-resident persistent LSTM forward and
// backward (see lstm_persistent_cluster.h). Plain C++, like lstm_persistent_tc_cuda.h.
// Instantiated for __half and __nv_bfloat16; Hopper (compute capability 9.0)
// and newer only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_persistent_cluster.h"
#include "pipelstm/kernels/lstm_persistent_tc_cuda.h"  // TcFit

namespace pipelstm {
namespace kernels {

// The launch geometry for (batch, hidden) on `device`: a cluster of
// `blocks` blocks (0: the smallest whose shared memory fits, up to 16),
// separating steps as `sync` says (lstm_persistent_cluster.h).
// Sets *fit (kArchitecture below compute capability 9.0; kSharedMemory where
// no cluster's blocks fit; kCoResidency where the device cannot hold the
// cluster at once); *plan is meaningful only where *fit is kFits.
template <typename T>
cudaError_t cluster_forward_plan(int64_t batch, int64_t hidden, int64_t blocks, cluster::Sync sync, int device,
                                 cluster::ClusterPlan* plan, TcFit* fit);

// Runs the forward of one layer direction (PersistentForwardArgs's layouts,
// no projection) on `stream` as one cluster launch. Where the shape does
// not fit, sets *fit, launches nothing and returns cudaSuccess.
template <typename T>
cudaError_t cluster_forward_cuda(const PersistentForwardArgs<T>& args, int64_t blocks, cluster::Sync sync,
                                 cudaStream_t stream, TcFit* fit);

// The backward's geometry (lstm_persistent_cluster.h, BackwardClusterPlan):
// `blocks` blocks, 0 for the smallest cluster that fits. As
// cluster_forward_plan.
template <typename T>
cudaError_t cluster_backward_plan(int64_t batch, int64_t hidden, int64_t blocks, int device,
                                  cluster::BackwardClusterPlan* plan, TcFit* fit);

// Runs the backward of one layer direction (PersistentBackwardArgs) on
// `stream` as one cluster launch: grad_gates of every step, grad_h0 and
// grad_c0. steps must be positive. Where the shape does not fit, sets *fit,
// launches nothing and returns cudaSuccess.
template <typename T>
cudaError_t cluster_backward_cuda(const PersistentBackwardArgs<T>& args, int64_t blocks, cudaStream_t stream,
                                  TcFit* fit);

}  // namespace kernels
}  // namespace pipelstm
