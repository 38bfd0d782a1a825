// CUDA entry points of the persistent recurrent forward kernel (see
// lstm_persistent.h). Plain C++, like lstm_pointwise_cuda.h. Instantiated
// for float, __half and __nv_bfloat16 (math in float).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "pipelstm/kernels/lstm_persistent.h"

namespace pipelstm {
namespace kernels {

// Whether the kernel fits this hidden size on `device`: every block's slice
// of w_hh in shared memory and one block per multiprocessor resident at once.
template <typename T>
bool persistent_forward_fits(int64_t hidden, int device);

// Launches the kernel on `stream` (asynchronous, cooperative); returns the
// launch error.
template <typename T>
cudaError_t persistent_forward_cuda(const PersistentForwardArgs<T>& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace pipelstm
