// The CUDA kernels as the CUDA layer and cell ops call them, in ATen's
// element types (`T`: float, double, c10::Half or c10::BFloat16 where the
// kernel has it). Each launches on the current stream with no host
// synchronisation (so the ops are capturable in a CUDA graph) and raises a
// launch error as torch's. Compiled only in a CUDA build.
//
// - The pointwise LSTM step (pointwise_cuda.cpp; kernels/.../
//   lstm_pointwise_cuda.h): one launch per step.
// - The persistent whole-sequence kernels (persistent_cuda.cpp): the SIMT
//   forward (kernels/.../lstm_persistent_cuda.h: float, c10::Half,
//   c10::BFloat16) and the tensor-core forward and backward
//   (lstm_persistent_tc_cuda.h: c10::Half, c10::BFloat16). Each runs one
//   dense layer direction's recurrence in one cooperative launch and
//   returns true, or returns false, having launched nothing, where the
//   shape does not fit the device (the caller runs its step loop).
#pragma once

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_persistent_tc.h"
#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace cuda {

template <typename T>
void pointwise_forward(const kernels::PointwiseForwardArgs<T>& a);

template <typename T>
void pointwise_backward(const kernels::PointwiseBackwardArgs<T>& a);

template <typename T>
bool persistent_forward(const kernels::PersistentForwardArgs<T>& a);

template <typename T>
bool persistent_tc_forward(const kernels::PersistentForwardArgs<T>& a);

template <typename T>
bool persistent_tc_backward(const kernels::PersistentBackwardArgs<T>& a);

}  // namespace cuda
}  // namespace pipelstm
