// CUDA entry points of the fused LSTM pointwise step (see lstm_pointwise.h for
// the argument layouts). Plain C++: includable from g++-compiled sources with
// the CUDA include directory on the path; only the .cu needs nvcc.
//
// Both calls are asynchronous on `stream` and return the launch error
// (cudaGetLastError after the launch), so callers can raise their own error.
// Instantiated for float, __half and __nv_bfloat16 (math in float) and for
// double (math in double).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace kernels {

template <typename T>
cudaError_t pointwise_forward_cuda(const PointwiseForwardArgs<T>& args, cudaStream_t stream);

template <typename T>
cudaError_t pointwise_backward_cuda(const PointwiseBackwardArgs<T>& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace pipelstm
