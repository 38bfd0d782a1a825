// Untyped step buffers (pointwise_backend.h) as the kernel library's typed
// arguments; shared by every backend. `T` is the kernel's storage type.
#pragma once

#include "pipelstm/kernels/lstm_pointwise.h"
#include "pointwise_backend.h"

namespace pipelstm {

template <typename T>
kernels::PointwiseForwardArgs<T> typed_args(const StepForward& s) {
  kernels::PointwiseForwardArgs<T> a;
  a.gates = static_cast<const T*>(s.gates);
  a.hidden_gates = static_cast<const T*>(s.hidden_gates);
  a.bias_ih = static_cast<const T*>(s.bias_ih);
  a.bias_hh = static_cast<const T*>(s.bias_hh);
  a.c_prev = static_cast<const T*>(s.c_prev);
  a.act_gates = static_cast<T*>(s.act_gates);
  a.c = static_cast<T*>(s.c);
  a.h = static_cast<T*>(s.h);
  a.batch = s.batch;
  a.hidden = s.hidden;
  return a;
}

template <typename T>
kernels::PointwiseBackwardArgs<T> typed_args(const StepBackward& s) {
  kernels::PointwiseBackwardArgs<T> a;
  a.grad_h = static_cast<const T*>(s.grad_h);
  a.grad_c = static_cast<const T*>(s.grad_c);
  a.act_gates = static_cast<const T*>(s.act_gates);
  a.c_prev = static_cast<const T*>(s.c_prev);
  a.c = static_cast<const T*>(s.c);
  a.grad_gates = static_cast<T*>(s.grad_gates);
  a.grad_c_prev = static_cast<T*>(s.grad_c_prev);
  a.batch = s.batch;
  a.hidden = s.hidden;
  return a;
}

}  // namespace pipelstm
