// CUDA entry points of the persistent tensor-core LSTM kernels (see
// lstm_persistent_tc.h). Plain C++, like lstm_persistent_cuda.h.
// Instantiated for __half and __nv_bfloat16 (mma.sync m16n8k16, fp32
// accumulate and gate math); fp32 input is not taken (see docs/design/cuda.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_persistent_tc.h"

namespace pipelstm {
namespace kernels {

// Whether the kernel can run a shape on a device, and if not, why.
enum class TcFit : int {
  kFits = 0,
  kBadShape,             // batch or hidden not positive, unit_tiles or steps negative
                         // (the backward: steps not positive)
  kBatchTooLarge,        // batch > tc::kMaxBatch
  kArchitecture,         // compute capability below 8.0 (no bf16 / m16n8k16 mma.sync)
  kNoCooperativeLaunch,  // the device cannot launch cooperative kernels
  kSharedMemory,         // the block's weight slab does not fit in shared memory
  kCoResidency,          // not every block can be resident at once
};

// A sentence saying what `fit` means, for an error message or a log.
const char* tc_fit_message(TcFit fit);

// The launch geometry for (batch, hidden) on `device`: `unit_tiles` unit
// tiles of 8 hidden units per block, or 0 for the fewest that give every
// block its own multiprocessor. Sets *fit; *plan is meaningful only where
// *fit is kFits. Returns a CUDA error of the device queries (then *fit is
// not kFits).
template <typename T>
cudaError_t tc_persistent_forward_plan(int64_t batch, int64_t hidden, int64_t unit_tiles,
                                       int device, tc::ForwardPlan* plan, TcFit* fit);

// Runs the forward of one layer direction (PersistentForwardArgs's layouts,
// no projection) on `stream`, asynchronously, as one cooperative launch.
// Where the shape does not fit, sets *fit to the reason, launches nothing
// and returns cudaSuccess: the caller runs its step loop instead. Returns
// the error of the device queries or of the launch.
template <typename T>
cudaError_t tc_persistent_forward_cuda(const PersistentForwardArgs<T>& args, int64_t unit_tiles,
                                       cudaStream_t stream, TcFit* fit);

// The backward's geometry (M-tiles of 16 units; `unit_tiles` of them per
// block, 0 for the default), as tc_persistent_forward_plan.
template <typename T>
cudaError_t tc_persistent_backward_plan(int64_t batch, int64_t hidden, int64_t unit_tiles,
                                        int device, tc::BackwardPlan* plan, TcFit* fit);

// Runs the backward of one layer direction (PersistentBackwardArgs) on
// `stream` as one cooperative launch: grad_gates of every step, grad_h0 and
// grad_c0. steps must be positive. Where the shape does not fit, sets *fit
// to the reason, launches nothing and returns cudaSuccess.
template <typename T>
cudaError_t tc_persistent_backward_cuda(const PersistentBackwardArgs<T>& args,
                                        int64_t unit_tiles, cudaStream_t stream, TcFit* fit);

}  // namespace kernels
}  // namespace pipelstm
