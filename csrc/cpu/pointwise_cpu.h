// The pointwise LSTM step on the CPU (kernels/.../lstm_pointwise.h), batch
// rows split over ATen's intra-op threads: the step of the float64 step loop
// and of the cell ops. Instantiated for float and double.
#pragma once

#include "pipelstm/kernels/lstm_pointwise.h"

namespace pipelstm {
namespace cpu {

template <typename T>
void pointwise_forward(const kernels::PointwiseForwardArgs<T>& a);

template <typename T>
void pointwise_backward(const kernels::PointwiseBackwardArgs<T>& a);

}  // namespace cpu
}  // namespace pipelstm
