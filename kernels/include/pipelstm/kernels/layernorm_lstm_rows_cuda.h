// CUDA entry points of the LayerNorm LSTM's row kernels (the argument
// layouts are layernorm_lstm_rows.h's; what a thread of a row's block does,
// layernorm_lstm_rows_indexing.h). Plain C++: includable from g++-compiled
// sources with the CUDA include directory on the path; only the .cu needs
// nvcc.
//
// One block a row. Every call is asynchronous on `stream` and returns the
// launch error (cudaGetLastError after the launch). Instantiated for float
// and double, as the CPU rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pipelstm/kernels/layernorm_lstm_rows.h"

namespace pipelstm {
namespace kernels {

// Rows [0, rows) of x [rows, n] normalised in place, each row's
// 1 / sqrt(var + eps) into rstd[row] (layer_norm_rows).
template <typename T>
cudaError_t layer_norm_rows_cuda(T* x, T* rstd, int64_t n, T eps, int64_t rows, cudaStream_t stream);

// Its backward in place over rows [0, rows) (layer_norm_backward_rows).
template <typename T>
cudaError_t layer_norm_backward_rows_cuda(T* grad, const T* x_hat, const T* rstd, int64_t n, int64_t rows,
                                          cudaStream_t stream);

// Every row of one step's run (layernorm_step_forward_rows and
// layernorm_step_backward_rows over [0, a.batch)).
template <typename T>
cudaError_t layernorm_step_forward_cuda(const LayerNormStepForwardArgs<T>& a, cudaStream_t stream);

template <typename T>
cudaError_t layernorm_step_backward_cuda(const LayerNormStepBackwardArgs<T>& a, cudaStream_t stream);

}  // namespace kernels
}  // namespace pipelstm
