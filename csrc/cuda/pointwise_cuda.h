// The pointwise LSTM step on CUDA (kernels/.../lstm_pointwise_cuda.h): one
// launch on the current stream (no host synchronisation, so the layer ops
// are capturable in a CUDA graph), a launch error raised as torch's error.
// `T` is ATen's element type: float, double, c10::Half or c10::BFloat16.
// Compiled only in a CUDA build.
#pragma once

#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace cuda {

template <typename T>
void pointwise_forward(const kernels::PointwiseForwardArgs<T>& a);

template <typename T>
void pointwise_backward(const kernels::PointwiseBackwardArgs<T>& a);

}  // namespace cuda
}  // namespace pipelstm
