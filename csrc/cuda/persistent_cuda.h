// The persistent whole-sequence kernels in ATen's element types: the SIMT
// forward (kernels/.../lstm_persistent_cuda.h: float, c10::Half,
// c10::BFloat16) and the tensor-core forward and backward
// (lstm_persistent_tc_cuda.h: c10::Half, c10::BFloat16). Each runs one
// dense layer direction's recurrence in one cooperative launch on the
// current stream and returns true, or returns false, having launched
// nothing, where the shape does not fit the device (the caller runs its
// step loop); a launch error is raised as torch's. CUDA build only.
#pragma once

#include "pipelstm/kernels/lstm_persistent.h"
#include "pipelstm/kernels/lstm_persistent_tc.h"

namespace pipelstm {
namespace cuda {

template <typename T>
bool persistent_forward(const kernels::PersistentForwardArgs<T>& a);

template <typename T>
bool persistent_tc_forward(const kernels::PersistentForwardArgs<T>& a);

template <typename T>
bool persistent_tc_backward(const kernels::PersistentBackwardArgs<T>& a);

}  // namespace cuda
}  // namespace pipelstm
